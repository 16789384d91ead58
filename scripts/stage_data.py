"""Stages a dataset in a Cloud Storage bucket as sharded TFRecords plus its schema.

    python scripts/stage_data.py --demo --destination=gs://BUCKET/data          # the demo dataset
    python scripts/stage_data.py --source='local/train*.csv' --schema=schema.json \\
        --destination=gs://BUCKET/data/train --num_shards=16                      # your own CSV or TFRecord files

CSV rows are converted to `tf.train.Example`s with the schema's types; TFRecord files are re-sharded as they
are. Shards are written to a local scratch dir, then uploaded in parallel with google-cloud-storage (the
Python client is the right tool for bulk uploads; on the emulator it goes anonymous by itself through
STORAGE_EMULATOR_HOST). `schema.json` lands beside the shards, where the trainer looks for it by default.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from scripts import demo_data  # pylint: disable=wrong-import-position
from trainer import schema as schema_lib  # pylint: disable=wrong-import-position


def split_gcs_uri(uri: str) -> tuple[str, str]:
  if not uri.startswith("gs://") or len(uri) <= 5:
    raise SystemExit(f"error: --destination must be gs://BUCKET/PREFIX, got {uri!r}")
  bucket, _, prefix = uri[5:].partition("/")
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
      raise SystemExit(f"error: uploading {name} to {destination} failed: {result}")
  return [f"gs://{bucket_name}/{prefix}/{name}" if prefix else f"gs://{bucket_name}/{name}" for name in names]


def convert_files(sources: list[str], schema: schema_lib.Schema, out_dir: str, *, num_shards: int) -> int:
  """Re-shards TFRecord files, or converts CSV files to Examples, into `num_shards` files; returns the count."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  csv_input = all(s.endswith(".csv") for s in sources)
  if csv_input:
    names = list(schema.columns)
    types = {f.name: f.type for f in schema.features}
    types[schema.label.name] = schema.label.type
    defaults = [{"float": tf.float32, "int": tf.int64, "string": tf.string}[types[n]] for n in names]
    records = tf.data.experimental.make_csv_dataset(
        sources, batch_size=1, column_names=None, select_columns=names, column_defaults=defaults, shuffle=False,
        num_epochs=1).unbatch()
  else:
    records = tf.data.TFRecordDataset(sources)
  writers = [tf.io.TFRecordWriter(os.path.join(out_dir, f"part-{i:05d}-of-{num_shards:05d}.tfrecord"))
             for i in range(num_shards)]
  count = 0
  try:
    for record in records:
      if csv_input:
        columns = {name: value.numpy()[None] for name, value in record.items()}
        payload = demo_data.example_bytes(columns, 0, schema.to_dict())
      else:
        payload = record.numpy()
      writers[count % num_shards].write(payload)
      count += 1
  finally:
    for writer in writers:
      writer.close()
  return count


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--destination", required=True, help="gs://BUCKET/PREFIX")
  parser.add_argument("--demo", action="store_true", help="stage the demo dataset (train/ and eval/)")
  parser.add_argument("--source", help="local file pattern (CSV or TFRecord)")
  parser.add_argument("--schema", help="schema JSON for --source")
  parser.add_argument("--num_shards", type=int, default=8)
  args = parser.parse_args()
  if args.num_shards < 1:
    parser.error(f"--num_shards must be >= 1, got {args.num_shards}")
  split_gcs_uri(args.destination)
  with tempfile.TemporaryDirectory(prefix="stage-") as scratch:
    if args.demo:
      summary = demo_data.make(scratch, num_shards=args.num_shards, formats=("tfrecord",))
    else:
      if not args.source or not args.schema:
        parser.error("give --demo, or --source and --schema")
      sources = sorted(glob.glob(args.source))
      if not sources:
        raise SystemExit(f"error: --source: no files match {args.source!r}")
      schema = schema_lib.parse_schema(json.load(open(args.schema)), source=args.schema)
      count = convert_files(sources, schema, scratch, num_shards=args.num_shards)
      with open(os.path.join(scratch, "schema.json"), "w") as f:
        json.dump(schema.to_dict(), f, indent=2)
      summary = {"examples": count}
    uris = upload_tree(scratch, args.destination)
  summary.update({"destination": args.destination, "objects": len(uris)})
  summary.pop("output_dir", None)
  print(json.dumps(summary))


if __name__ == "__main__":
  main()
