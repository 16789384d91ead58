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
from typing import MutableMapping

from absl import app
from absl import flags
from absl import logging

from trainer import flags as trainer_flags
from trainer.core import config as config_lib
from trainer.core import hparams as hparams_lib
from trainer.core import logs
from trainer.core import storage
from trainer.core.errors import EXIT_EXTERNAL_FAILURE
from trainer.core.errors import EXIT_OK
from trainer.core.errors import EXIT_PREEMPTED
from trainer.core.errors import EXIT_USER_ERROR
from trainer.core.errors import ExternalFailure
from trainer.core.errors import UserError
from trainer.data import formats
from trainer.distribute import preemption



def run_command(argv: list[str], environ: MutableMapping[str, str], *,
                flag_values: flags.FlagValues | None = None, log_format: str = "text") -> int:
  """The whole command: flags and environment -> typed config -> `runner.run`. Returns the exit code.

  Bad input is one `error:` line on stderr (a JSON ERROR record when `log_format` is json) and EXIT_USER_ERROR. With `flag_values` (fresh, trainer flags
  defined) it parses `argv` itself, so tests run the command in-process; the CLI passes already-parsed flags.
  """
  def _fail(message: str, *, code: int = EXIT_USER_ERROR) -> int:
    sys.stderr.write(logs.error_line(message, log_format, environ) + "\n")
    return code

  if flag_values is None:
    flag_values = flags.FLAGS
  else:
    storage.configure_gcs(environ)  # a plug-in module imported for its HPARAMS may import TensorFlow
    try:
      hparams_lib.define_for_argv(flag_values, argv)
      argv = flag_values(argv)
    except UserError as e:
      return _fail(str(e))
    except flags.Error as e:
      return _fail(hparams_lib.explain_flag_error(e, argv))
  if len(argv) > 1:
    return _fail(f"unexpected positional argument(s): {' '.join(argv[1:])}; every option is a --flag "
                 "(see --help)")
  storage.configure_gcs(environ)  # before anything imports TensorFlow
  formats.configure(environ)
  from trainer import runner  # pylint: disable=g-import-not-at-top  (imports TensorFlow)

  try:
    env = config_lib.Environment.from_mapping(environ)
    config = trainer_flags.config_from_flags(flag_values, env)
    runner.run(config, env, dry_run=flag_values.dry_run,
               interactive=log_format == "text" and sys.stderr.isatty())  # a progress bar only on a terminal
  except UserError as e:
    return _fail(str(e))
  except ExternalFailure as e:
    return _fail(str(e), code=EXIT_EXTERNAL_FAILURE)
  except (preemption.Preempted, preemption.PeerLost) as e:
    # Not 0: Vertex would take a chief's 0 as the job's success. The restarted replica resumes at the last
    # checkpoint (a preemption's save: e.step).
    logging.warning("Preempted (%s); exiting %d so that Vertex restarts this replica", e, EXIT_PREEMPTED)
    return EXIT_PREEMPTED
  except Exception as e:  # pylint: disable=broad-except  (a storage outage is one line; anything else re-raised)
    outage = storage.storage_failure(e, fallback_uri=environ.get("AIP_MODEL_DIR") or flag_values["output_dir"].value)
    if outage is None:
      raise
    return _fail(str(outage), code=EXIT_EXTERNAL_FAILURE)
  return EXIT_OK


def main(argv: list[str]) -> int:
  log_format = logs.configure(flags.FLAGS.log_format, os.environ)
  code = run_command(argv, os.environ, log_format=log_format)
  preemption.release_sigterm("before training started")  # a run that ended before its strategy existed
  if code in (EXIT_EXTERNAL_FAILURE, EXIT_PREEMPTED):
    # Storage or a peer is gone: TensorFlow's clean-up at exit would retry it (summary writers flush again, each
    # flush retried for about 40 s; measured: minutes after the error line). Preempted: the checkpoint is saved
    # and closed, and a MultiWorkerMirrored chief's clean-up waited on its stopped peers past Spot's 30 s
    # (measured: SIGKILLed after the grace). Nothing is left worth saving in either case.
    logging.flush()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # pylint: disable=protected-access
  return code


def _parse_flags(argv: list[str]) -> list[str]:
  """absl's parser, with a plug-in model's declared hyperparameters as flags (`trainer.core.hparams`); a bad flag is
  one 'error:' line and exit 2 like every other bad input."""
  try:
    storage.configure_gcs(os.environ)  # before the plug-in module (which may import TensorFlow) is imported
    hparams_lib.define_for_argv(flags.FLAGS, argv)
    flags.adopt_module_key_flags(hparams_lib)  # --help lists the --model plug-in's hyperparameters too
    return flags.FLAGS(argv)
  except (flags.Error, UserError) as e:
    message = str(e) if isinstance(e, UserError) else hparams_lib.explain_flag_error(e, argv)
    log_format = logs.resolve("auto", os.environ, sys.stderr)  # the flags, --log_format included, did not parse
    sys.stderr.write(logs.error_line(message, log_format, os.environ) + "\n")
    sys.exit(EXIT_USER_ERROR)


def entry() -> None:
  preemption.hold_sigterm()  # first: a SIGTERM from now on is honoured, whatever handler TensorFlow installs
  trainer_flags.define_flags()
  flags.adopt_module_key_flags(trainer_flags)  # --help lists the trainer's flags, not only absl's
  app.run(main, flags_parser=_parse_flags)


if __name__ == "__main__":
  entry()
