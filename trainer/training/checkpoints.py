"""Checkpoints: every worker saves (MultiWorkerMirroredStrategy needs all of them to), only the chief's land
in the checkpoint dir; the others go to a private temporary dir that is removed at the end.

Every worker restores from the chief's dir, so a restarted job, or a restarted worker, resumes from the same
step and the run ends at the same final step.
"""

from __future__ import annotations

import tempfile

from absl import logging

from trainer.core import storage
from trainer.core.errors import first_line
from trainer.core.errors import UserError

_WHAT_TO_DO = "use a new --output_dir (or --checkpoint_dir), or remove that directory to start over"


def latest_step(directory: str) -> int | None:
  """The step of the newest checkpoint in `directory` (named ckpt-<step>), or None. File reads only: safe
  before the strategy is built."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  path = tf.train.latest_checkpoint(directory)
  return int(path.rsplit("-", 1)[1]) if path else None


def check_resume_step(step: int, train_steps: int, *, directory: str) -> None:
  """A checkpoint beyond the final step belongs to another run: training on would silently do nothing."""
  if step > train_steps:
    raise UserError(f"--checkpoint_dir: {directory} holds a checkpoint at step {step}, beyond "
                    f"--train_steps={train_steps}; pass --train_steps >= {step} to continue that run, or "
                    f"{_WHAT_TO_DO}")


class CheckpointKeeper:
  """Saves and restores one `tf.train.Checkpoint` for this process's role."""

  def __init__(self, checkpoint, *, directory: str, is_chief: bool, max_to_keep: int = 3):
    import tensorflow as tf  # pylint: disable=g-import-not-at-top

    self._checkpoint = checkpoint
    self._directory = directory
    self._temp_dir = None if is_chief else tempfile.mkdtemp(prefix="trainer-ckpt-worker-")
    self._manager = tf.train.CheckpointManager(checkpoint, self._temp_dir or directory, max_to_keep=max_to_keep)
    self.last_saved_step: int | None = None
    self._last_path: str | None = None

  def restore_latest(self) -> str | None:
    """Restores the chief's latest checkpoint, if any; returns its path.

    A checkpoint written by another model (other layers or sizes) is a UserError naming it: restoring it
    partially would train a model that is neither the old one nor a fresh one.
    """
    import tensorflow as tf  # pylint: disable=g-import-not-at-top

    path = tf.train.latest_checkpoint(self._directory)
    if not path:
      return None
    try:
      status = self._checkpoint.restore(path)
      # Every variable of this model and optimizer must come from the checkpoint (one that is missing means
      # the model changed), and every value in the checkpoint must land somewhere.
      status.assert_existing_objects_matched()
      status.assert_consumed()
    except (AssertionError, ValueError, tf.errors.OpError) as e:
      raise UserError(f"--checkpoint_dir: checkpoint {path} does not match this model ({first_line(e)}); it was "
                      "written by a different model or different model flags: rerun with that run's flags (its "
                      f"trainer_config.json beside the checkpoints has them), or {_WHAT_TO_DO}") from None
    logging.info("Restored checkpoint %s", path)
    return path

  def save(self, step: int) -> str:
    """Saves at `step` (once: a second call for the same step returns the first one's path)."""
    if step == self.last_saved_step:
      return self._last_path
    path = self._manager.save(checkpoint_number=step)
    logging.info("Saved checkpoint %s", path if self._temp_dir is None else f"(worker temp) {path}")
    self.last_saved_step, self._last_path = step, path
    return path

  def close(self) -> None:
    if self._temp_dir:
      storage.remove_tree(self._temp_dir)
      self._temp_dir = None
