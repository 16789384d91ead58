"""Stages a dataset in a Cloud Storage bucket as sharded TFRecords plus its schema.

    python -m scripts.stage_data --demo --destination=gs://BUCKET/data          # the demo dataset
    python -m scripts.stage_data --source='local/train*.csv' --schema=schema.json \\
        --destination=gs://BUCKET/data/train --num_shards=16                      # your own CSV or TFRecord files
    python -m scripts.stage_data --source='local/train*.csv' --label=churned --destination=...  # schema inferred

The trainer reads CSV, JSONL and gzip files as they are; staging is for re-sharding into TFRecord (the fastest
input) and for files on a laptop that the job should read from a bucket.

CSV rows (plain or gzip, with a header) are converted to `tf.train.Example`s with the schema's types; TFRecord
files (plain or gzip) are re-sharded as they are. Shards are written to a local scratch dir, then uploaded in
parallel with google-cloud-storage (the Python client is the right tool for bulk uploads; on the emulator it goes
anonymous by itself through STORAGE_EMULATOR_HOST). `schema.json` lands beside the shards, where the trainer
looks for it by default.
"""

from __future__ import annotations

import argparse
import csv
import glob
import gzip
import json
import os
import sys
import tempfile
from typing import Iterator


from scripts import demo_data
from trainer import examples
from trainer import paths
from trainer import schema as schema_lib
from trainer.errors import UserError


class StageError(RuntimeError):
  """Bad input to the staging command; the message is one line."""


def split_gcs_uri(uri: str) -> tuple[str, str]:
  try:
    bucket, prefix = paths.split_gcs_uri(uri)
  except ValueError:
    raise StageError(f"--destination must be gs://BUCKET/PREFIX, got {uri!r}") from None
  return bucket, prefix.strip("/")


def upload_tree(local_dir: str, destination: str, *, workers: int = 8, client=None) -> list[str]:
  """Uploads every file under `local_dir` to `destination` (gs://); returns the object URIs."""
  from google.cloud import storage  # pylint: disable=g-import-not-at-top
  from google.cloud.storage import transfer_manager  # pylint: disable=g-import-not-at-top

  bucket_name, prefix = split_gcs_uri(destination)
  client = client or storage.Client(project=os.environ.get("GOOGLE_CLOUD_PROJECT", "local-project"))
  bucket = client.bucket(bucket_name)
  names = sorted(os.path.relpath(p, local_dir) for p in glob.glob(os.path.join(local_dir, "**"), recursive=True)
                 if os.path.isfile(p))
  results = transfer_manager.upload_many_from_filenames(
      bucket, names, source_directory=local_dir, blob_name_prefix=f"{prefix}/" if prefix else "",
      max_workers=workers, worker_type=transfer_manager.THREAD)
  for name, result in zip(names, results):
    if isinstance(result, Exception):
      raise StageError(f"uploading {name} to {destination} failed: {result}")
  return [f"gs://{bucket_name}/{prefix}/{name}" if prefix else f"gs://{bucket_name}/{name}" for name in names]


_GZIP_MAGIC = b"\x1f\x8b"


def _is_gzip(path: str) -> bool:
  with open(path, "rb") as f:
    return f.read(2) == _GZIP_MAGIC


def _is_csv(path: str) -> bool:
  return path.endswith((".csv", ".csv.gz"))


def csv_rows(path: str) -> Iterator[tuple[int, dict[str, str]]]:
  """(line number, row by column name) of a CSV file with a header, plain or gzip, as Python's csv reads it
  (quoted fields, commas and newlines inside quotes)."""
  opener = gzip.open if _is_gzip(path) else open
  with opener(path, "rt", newline="", encoding="utf-8") as f:
    reader = csv.DictReader(f)
    for row in reader:
      yield reader.line_num, row


def row_example(row: dict[str, str], schema: schema_lib.Schema, *, where: str) -> bytes:
  """One CSV row as a serialized tf.train.Example typed by the schema.

  Empty cells: a string or text feature becomes "" (out of vocabulary, no words), a numeric one the
  feature's schema `mean` (else 0), so a row is not lost for one missing value; an empty label is an error.
  """
  values = {}
  for column in schema.features + (schema.label,):
    name, kind = column.name, column.type
    if name not in row:
      raise StageError(f"{where}: no column {name!r} (the header has: {', '.join(k for k in row if k)})")
    if row[name] is None:
      raise StageError(f"{where}: the row has fewer fields than the header (no value for {name!r})")
    text = row[name].strip()
    if kind == "image":
      raise StageError(f"{where}: image feature {name!r} cannot come from CSV; stage TFRecord files")
    if kind in ("string", "text"):
      values[name] = row[name]
      continue
    if not text:
      if column is schema.label:
        raise StageError(f"{where}: the label {name!r} is empty; every row needs a label")
      text = str(getattr(column, "mean", None) or 0)
    values[name] = _number(text, kind)
    if values[name] is None:
      raise StageError(f"{where}: column {name!r} holds {row[name]!r}, but the schema says {kind}")
  return examples.serialize(values, schema)


def _number(text: str, kind: str) -> float | int | None:
  """`text` as the schema's numeric type; None when it is not one ("1.5" is no int; "3.0" is 3)."""
  try:
    value = float(text)
  except ValueError:
    return None
  if kind == "float":
    return value
  return int(value) if value.is_integer() else None


def _records(sources: list[str], schema: schema_lib.Schema) -> Iterator[bytes]:
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  for path in sources:
    if _is_csv(path):
      for line, row in csv_rows(path):
        yield row_example(row, schema, where=f"--source: {path} line {line}")
      continue
    compression = "GZIP" if _is_gzip(path) else ""
    try:
      for record in tf.data.TFRecordDataset(path, compression_type=compression).as_numpy_iterator():
        yield record
    except tf.errors.OpError as e:
      raise StageError(f"--source: {path} is not a readable TFRecord file ({e.message.splitlines()[0]}); expected "
                       "TFRecord (plain or gzip) or CSV (.csv, .csv.gz)") from None


def convert_files(sources: list[str], schema: schema_lib.Schema, out_dir: str, *, num_shards: int) -> int:
  """Re-shards TFRecord files (plain or gzip), or converts CSV files (plain or gzip) to Examples, into
  `num_shards` uncompressed TFRecord files; returns the count."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  writers = [tf.io.TFRecordWriter(os.path.join(out_dir, f"part-{i:05d}-of-{num_shards:05d}.tfrecord"))
             for i in range(num_shards)]
  count = 0
  try:
    for payload in _records(sources, schema):
      writers[count % num_shards].write(payload)
      count += 1
  except UnicodeDecodeError as e:
    raise StageError(f"--source: a CSV file is not UTF-8 text ({e.reason} at byte {e.start})") from None
  except csv.Error as e:
    raise StageError(f"--source: a CSV file cannot be parsed ({e})") from None
  finally:
    for writer in writers:
      writer.close()
  if not count:
    raise StageError(f"--source: {', '.join(sources)} hold no records")
  return count


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--destination", required=True, help="gs://BUCKET/PREFIX")
  parser.add_argument("--demo", action="store_true", help="stage the demo dataset (train/ and eval/)")
  parser.add_argument("--source", help="local file pattern: CSV with a header (.csv, .csv.gz) or TFRecord "
                      "(plain or gzip)")
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
      sources = sorted(p for p in glob.glob(args.source) if os.path.isfile(p))
      if not sources:
        raise StageError(f"--source: no files match {args.source!r}")
      schema = _load_schema(args.schema) if args.schema else _infer_schema(sources, args.label, args.task)
      count = convert_files(sources, schema, scratch, num_shards=args.num_shards)
      with open(os.path.join(scratch, "schema.json"), "w") as f:
        json.dump(schema.to_dict(), f, indent=2)
      summary = {"examples": count}
    uris = upload_tree(scratch, args.destination)
  summary.update({"destination": args.destination, "objects": len(uris)})
  summary.pop("output_dir", None)
  return summary


def _infer_schema(sources: list[str], label: str, task: str) -> schema_lib.Schema:
  from trainer import formats  # pylint: disable=g-import-not-at-top
  from trainer import schema_inference  # pylint: disable=g-import-not-at-top

  source = formats.source_for(sources, flag="--source")
  if source.format == "csv" and not source.header:
    raise StageError(f"--source: {sources[0]} has no header row; stage_data converts CSV with a header (the "
                     "trainer reads headerless CSV itself, with --csv_columns)")
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
