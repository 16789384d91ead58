"""`python -m trainer.schema_inference`: infer a schema.json from the data for review (the inference itself:
`trainer/data/inference.py`)."""

from __future__ import annotations

import argparse
import json
import os
import sys

from trainer.core import config as config_lib
from trainer.core import paths
from trainer.core import storage
from trainer.core.errors import EXIT_OK
from trainer.core.errors import EXIT_USER_ERROR
from trainer.core.errors import UserError
from trainer.data import formats
from trainer.data import inference
from trainer.data import schema as schema_lib


def main(argv: list[str] | None = None) -> int:
  """`python -m trainer.schema_inference`: infer and write schema.json for review."""
  parser = argparse.ArgumentParser(prog="python -m trainer.schema_inference",
                                   description=inference.__doc__.split("\n\n")[0])
  parser.add_argument("--data", required=True, help="file pattern (local, gs://, /gcs/) or a BigQuery table (bq://PROJECT.DATASET.TABLE)")
  parser.add_argument("--label", required=True, help="the label column")
  parser.add_argument("--task", choices=config_lib.TASKS, default="auto")
  parser.add_argument("--data_format", choices=("auto", *formats.FLAG_VALUES), default="auto")
  parser.add_argument("--csv_columns", default=None, help="comma-separated CSV column names (files without header)")
  parser.add_argument("--output", default=None, help="where to write schema.json (default: beside the data; for a table, ./schema.json)")
  parser.add_argument("--infer_sample_rows", type=int, default=inference.InferenceConfig.sample_rows)
  parser.add_argument("--vocab_min_count", type=int, default=inference.InferenceConfig.vocab_min_count)
  parser.add_argument("--max_vocab_size", type=int, default=inference.InferenceConfig.max_vocab_size)
  args = parser.parse_args(argv)
  storage.configure_gcs(os.environ)
  formats.configure(os.environ)
  try:
    pattern = paths.normalize_path(args.data)
    files = storage.list_files(pattern, flag="--data")
    columns = tuple(c.strip() for c in args.csv_columns.split(",")) if args.csv_columns else None
    source = formats.source_for(files, requested=args.data_format, columns=columns, flag="--data")
    config = inference.InferenceConfig(label=args.label, task=args.task, sample_rows=args.infer_sample_rows,
                                       vocab_min_count=args.vocab_min_count, max_vocab_size=args.max_vocab_size)
    inference.check_inference_config(config)
    schema = inference.infer_schema(files, source, config, flag="--data",
                                    log=lambda line: print(line, file=sys.stderr))
    beside = (pattern.rsplit("/", 1)[0] if "/" in pattern and not pattern.startswith(storage.TABLE_SCHEMES)
              else ".")  # a table (bq://) has no folder: the current one
    output = args.output or paths.join_path(beside, schema_lib.SCHEMA_FILE)
    storage.write_json(paths.normalize_path(output), schema.to_dict())
  except UserError as e:
    print(f"error: {e}", file=sys.stderr)
    return EXIT_USER_ERROR
  print(json.dumps(schema.to_dict(), indent=2))
  print(f"wrote {output}", file=sys.stderr)
  return EXIT_OK


if __name__ == "__main__":
  raise SystemExit(main())
