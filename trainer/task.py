"""Entry point: `python -m trainer.task --train_data=... --output_dir=... [flags]`.

Intentionally short: parse flags and environment into a typed config, then call `runner.run`. Bad input
(`UserError`) ends with one log line and exit code 2; nothing runs at import time.
"""

from __future__ import annotations

import os
import sys

from absl import app
from absl import flags

from trainer import config as config_lib
from trainer import flags as trainer_flags
from trainer import storage
from trainer.errors import UserError

EXIT_USER_ERROR = 2


def main(argv: list[str]) -> int:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected positional arguments: {' '.join(argv[1:])}; every option is a --flag")
  storage.configure_gcs_reads(os.environ)  # before anything imports TensorFlow
  from trainer import runner  # pylint: disable=g-import-not-at-top  (imports TensorFlow)

  try:
    env = config_lib.Environment.from_mapping(os.environ)
    config = trainer_flags.config_from_flags(flags.FLAGS, env)
    runner.run(config, env, dry_run=flags.FLAGS.dry_run, interactive=sys.stderr.isatty())
  except UserError as e:
    sys.stderr.write(f"error: {e}\n")
    return EXIT_USER_ERROR
  return 0


def entry() -> None:
  trainer_flags.define_flags()
  app.run(main)


if __name__ == "__main__":
  entry()
