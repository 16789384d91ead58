"""Stages a dataset in a Cloud Storage bucket as sharded TFRecords plus its schema.

    python -m scripts.stage_data --demo --destination=gs://BUCKET/data          # the demo dataset
    python -m scripts.stage_data --source='local/train*.csv' --schema=schema.json \\
        --destination=gs://BUCKET/data/train --num_shards=16     # your own CSV, JSONL, Parquet or TFRecord files
    python -m scripts.stage_data --source='local/train*.csv' --label=churned --destination=...  # schema inferred

The trainer reads CSV, JSONL, Parquet and gzip files as they are; staging is for re-sharding into TFRecord (the
fastest input) and for files on a laptop that the job should read from a bucket.

CSV, JSONL and Parquet records are converted to `tf.train.Example`s exactly as the trainer reads those files
(`trainer.planning.examples.from_file`: its reader, CSV dialect and header handling, pre-flight record check and
defaults): a missing value (an empty CSV cell) takes the schema's `default`, and a record training would refuse
(a missing value without a default, NaN or an infinity, a value of the wrong type) is refused with the same
one-line error, naming the file, the line and the column. TFRecord files (plain or gzip) are re-sharded as they
are. Shards are written to a local scratch dir, and only once every record has converted are they uploaded in
parallel with google-cloud-storage (the Python client is the right tool for bulk uploads; on the emulator it goes
anonymous by itself through STORAGE_EMULATOR_HOST), so a failed staging leaves nothing at the destination.
`schema.json` lands beside the shards, where the trainer looks for it by default.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys
import tempfile
from typing import Iterator

from scripts import demo_data
from scripts import progress as progress_lib
from trainer.core import paths
from trainer.core import storage
from trainer.core.errors import UserError
from trainer.data import formats
from trainer.data import schema as schema_lib
from trainer.planning import examples


class StageError(RuntimeError):
  """Bad input to the staging command; the message is one line."""


def split_gcs_uri(uri: str) -> tuple[str, str]:
  try:
    bucket, prefix = paths.split_gcs_uri(uri)
  except ValueError:
    raise StageError(f"--destination must be gs://BUCKET/PREFIX, got {uri!r}") from None
  return bucket, prefix.strip("/")


def upload_tree(local_dir: str, destination: str, *, workers: int = 8, client=None,
                progress: progress_lib.Progress | None = None) -> list[str]:
  """Uploads every file under `local_dir` to `destination` (gs://), `workers` at a time, in batches that report
  to `progress` (default: a bar on a terminal, a line every 10 s elsewhere, on stderr); returns the object URIs."""
  from google.cloud import storage  # pylint: disable=g-import-not-at-top
  from google.cloud.storage import transfer_manager  # pylint: disable=g-import-not-at-top

  bucket_name, prefix = split_gcs_uri(destination)
  client = client or storage.Client(project=os.environ.get("GOOGLE_CLOUD_PROJECT", "local-project"))
  bucket = client.bucket(bucket_name)
  names = sorted(os.path.relpath(p, local_dir) for p in glob.glob(os.path.join(local_dir, "**"), recursive=True)
                 if os.path.isfile(p))
  step = max(4 * workers, 32)  # enough files per batch to keep every worker busy
  with progress or progress_lib.Progress(total=len(names), what=f"staging to {destination}", unit="file") as reporter:
    for start in range(0, len(names), step):
      batch = names[start:start + step]
      results = transfer_manager.upload_many_from_filenames(
          bucket, batch, source_directory=local_dir, blob_name_prefix=f"{prefix}/" if prefix else "",
          max_workers=workers, worker_type=transfer_manager.THREAD)
      for name, result in zip(batch, results):
        if isinstance(result, Exception):
          raise StageError(f"uploading {name} to {destination} failed: {result}")
      reporter.advance(len(batch))
  return [f"gs://{bucket_name}/{prefix}/{name}" if prefix else f"gs://{bucket_name}/{name}" for name in names]


def _records(sources: list[str], source: formats.Source, schema: schema_lib.Schema) -> Iterator[bytes]:
  """Serialized Examples of every file: TFRecord records as they are; CSV, JSONL and Parquet records converted
  by the trainer's own reader, record check and defaults (`examples.from_file`), so the staged Examples train as
  the files themselves would, and a record training would refuse is refused here with the same line."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  for path in sources:
    if formats.FORMATS[source.format].holds_examples:
      try:
        for record in tf.data.TFRecordDataset(path, compression_type=source.compression).as_numpy_iterator():
          yield record
      except tf.errors.OpError as e:
        raise StageError(f"--source: {path} is not a readable TFRecord file ({e.message.splitlines()[0]}); "
                         "expected TFRecord (plain or gzip), CSV, JSONL or Parquet") from None
      continue
    yield from examples.from_file(path, _file_source(path, source, schema), schema, flag="--source")


def _file_source(path: str, source: formats.Source, schema: schema_lib.Schema) -> formats.Source:
  """How to read `path` as the trainer reads a file of a split: CSV columns and header settled for this file (a
  file without a header row is not read as if its first row were one), and the schema checked against the
  format (CSV holds no image bytes or lists; a Parquet column's type must hold its kind)."""
  source = formats.settle(source, path, schema, flag="--source")
  formats.check_schema(schema, source, [path], flag="--source")
  return source


def convert_files(sources: list[str], schema: schema_lib.Schema, out_dir: str, *, num_shards: int,
                  source: formats.Source | None = None) -> int:
  """Re-shards TFRecord files (plain or gzip), or converts CSV, JSONL or Parquet files to Examples as the trainer
  reads them, into `num_shards` uncompressed TFRecord files under `out_dir` (a scratch dir: nothing is uploaded
  unless every record converts); returns the count."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  source = source or _resolve(sources)
  if schema.label.multi_label and not formats.FORMATS[source.format].holds_examples:
    raise StageError(f"--source: the label {schema.label.name!r} is multi-label (a list of class names per record), "
                     "which the trainer reads from JSONL only: train on the JSONL files themselves (copy them to "
                     "the bucket as they are)")
  writers = [tf.io.TFRecordWriter(os.path.join(out_dir, f"part-{i:05d}-of-{num_shards:05d}.tfrecord"))
             for i in range(num_shards)]
  count = 0
  try:
    for payload in _records(sources, source, schema):
      writers[count % num_shards].write(payload)
      count += 1
  finally:
    for writer in writers:
      writer.close()
  if not count:
    raise StageError(f"--source: {', '.join(sources)} hold no records")
  return count


def _resolve(sources: list[str]) -> formats.Source:
  """The files' format and compression, as the trainer resolves --train_data (extension, then content)."""
  source = formats.resolve(sources, requested="auto", vertex_format=None, flag="--source")
  if formats.FORMATS[source.format].files_are_records:
    raise StageError(f"--source: {sources[0]} and the other files are images; the trainer reads image files in "
                     "class folders as they are: copy the folders to the bucket (gcloud storage cp -r)")
  return source


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--destination", required=True, help="gs://BUCKET/PREFIX")
  parser.add_argument("--demo", action="store_true", help="stage the demo dataset (train/ and eval/)")
  parser.add_argument("--source", help="file pattern or folder, listed and read as the trainer reads "
                      "--train_data: CSV (.csv, .csv.gz), JSONL, Parquet or TFRecord (plain or gzip)")
  parser.add_argument("--schema", help="schema JSON for --source")
  parser.add_argument("--label", help="without --schema: infer the schema from --source, with this label column "
                      "(as the trainer does; python -m trainer.schema_inference writes one to review)")
  parser.add_argument("--task", choices=("auto", "classification", "regression"), default="auto")
  parser.add_argument("--num_shards", type=int, default=8)
  args = parser.parse_args(argv)
  try:
    summary = stage(args, parser)
  except (StageError, UserError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  print(json.dumps(summary))
  return 0


def stage(args, parser) -> dict:
  if args.num_shards < 1:
    raise StageError(f"--num_shards must be >= 1, got {args.num_shards}")
  split_gcs_uri(args.destination)
  if not args.demo and (not args.source or not (args.schema or args.label)):
    parser.error("give --demo, or --source and --schema (or --label to infer the schema)")
  with tempfile.TemporaryDirectory(prefix="stage-") as scratch:
    if args.demo:
      summary = demo_data.make(scratch, num_shards=args.num_shards, formats=("tfrecord",))
    else:
      sources = storage.list_files(args.source, flag="--source")  # as the trainer lists --train_data
      source = _resolve(sources)
      schema = _load_schema(args.schema) if args.schema else _infer_schema(sources, source, args.label, args.task)
      count = convert_files(sources, schema, scratch, num_shards=args.num_shards, source=source)
      with open(os.path.join(scratch, "schema.json"), "w") as f:
        json.dump(schema.to_dict(), f, indent=2)
      summary = {"examples": count}
    uris = upload_tree(scratch, args.destination)
  summary.update({"destination": args.destination, "objects": len(uris)})
  summary.pop("output_dir", None)
  return summary


def _infer_schema(sources: list[str], source: formats.Source, label: str, task: str) -> schema_lib.Schema:
  from trainer.data import inference as schema_inference  # pylint: disable=g-import-not-at-top

  source = formats.settle(source, sources[0], flag="--source")
  if source.columns and not source.header:  # a headerless CSV
    raise StageError(f"--source: {sources[0]} has no header row, so --label cannot name a column; pass --schema "
                     "(its 'columns' name every field; without them its features and label are the fields in order)")
  return schema_inference.infer_schema(sources, source, schema_inference.InferenceConfig(label=label, task=task),
                                       flag="--source", log=lambda line: print(line, file=sys.stderr))


def _load_schema(path: str) -> schema_lib.Schema:
  try:
    with open(path) as f:
      value = json.load(f)
  except OSError as e:
    raise StageError(f"--schema: cannot read {path} ({e.strerror})") from None
  except json.JSONDecodeError as e:
    raise StageError(f"--schema: {path} is not valid JSON ({e.msg} at line {e.lineno})") from None
  return schema_lib.parse_schema(value, source=path)


if __name__ == "__main__":
  sys.exit(main())
