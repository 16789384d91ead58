r"""Trains a TensorFlow model on Vertex AI (or locally) and exports a SavedModel that Vertex serves.

  python -m trainer.task --train_data='gs://BUCKET/data/train/*.tfrecord' \
      --eval_data='gs://BUCKET/data/eval/*.tfrecord' --output_dir=gs://BUCKET/runs/run1 --train_steps=2000

On Vertex AI the data and output flags default to AIP_TRAINING_DATA_URI, AIP_VALIDATION_DATA_URI and
AIP_MODEL_DIR / AIP_CHECKPOINT_DIR / AIP_TENSORBOARD_LOG_DIR; the strategy follows TF_CONFIG / CLUSTER_SPEC.
Bad input ends in one 'error: ...' line and exit code 2. --dry_run prints the resolved plan.
"""

# The entry is intentionally short: parse flags and environment into a typed config, then call
# `runner.run`. Nothing runs at import time.

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
    return _fail(f"unexpected positional argument(s): {' '.join(argv[1:])}; every option is a --flag "
                 "(see --help)")
  storage.configure_gcs_reads(os.environ)  # before anything imports TensorFlow
  from trainer import runner  # pylint: disable=g-import-not-at-top  (imports TensorFlow)

  try:
    env = config_lib.Environment.from_mapping(os.environ)
    config = trainer_flags.config_from_flags(flags.FLAGS, env)
    runner.run(config, env, dry_run=flags.FLAGS.dry_run, interactive=sys.stderr.isatty())
  except UserError as e:
    return _fail(str(e))
  return 0


def _fail(message: str) -> int:
  sys.stderr.write(f"error: {message}\n")
  return EXIT_USER_ERROR


def _parse_flags(argv: list[str]) -> list[str]:
  """absl's parser, but a bad flag is one 'error:' line and exit 2 like every other bad input."""
  try:
    return flags.FLAGS(argv)
  except flags.Error as e:
    sys.stderr.write(f"error: {' '.join(str(e).split())} (see --help)\n")
    sys.exit(EXIT_USER_ERROR)


def entry() -> None:
  trainer_flags.define_flags()
  flags.adopt_module_key_flags(trainer_flags)  # --help lists the trainer's flags, not only absl's
  app.run(main, flags_parser=_parse_flags)


if __name__ == "__main__":
  entry()
