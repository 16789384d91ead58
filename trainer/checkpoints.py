"""Checkpoints: every worker saves (MultiWorkerMirroredStrategy needs all of them to), only the chief's land
in the checkpoint dir; the others go to a private temporary dir that is removed at the end.

Every worker restores from the chief's dir, so a restarted job, or a restarted worker, resumes from the same
step and the run ends at the same final step.
"""

from __future__ import annotations

import tempfile

from absl import logging

from trainer import storage


class CheckpointKeeper:
  """Saves and restores one `tf.train.Checkpoint` for this process's role."""

  def __init__(self, checkpoint, *, directory: str, is_chief: bool, max_to_keep: int = 3):
    import tensorflow as tf  # pylint: disable=g-import-not-at-top

    self._checkpoint = checkpoint
    self._directory = directory
    self._temp_dir = None if is_chief else tempfile.mkdtemp(prefix="trainer-ckpt-worker-")
    self._manager = tf.train.CheckpointManager(checkpoint, self._temp_dir or directory, max_to_keep=max_to_keep)

  def restore_latest(self) -> str | None:
    """Restores the chief's latest checkpoint, if any; returns its path."""
    import tensorflow as tf  # pylint: disable=g-import-not-at-top

    path = tf.train.latest_checkpoint(self._directory)
    if path:
      self._checkpoint.restore(path).expect_partial()
      logging.info("Restored checkpoint %s", path)
    return path

  def save(self, step: int) -> None:
    path = self._manager.save(checkpoint_number=step)
    logging.info("Saved checkpoint %s", path if self._temp_dir is None else f"(worker temp) {path}")

  def close(self) -> None:
    if self._temp_dir:
      storage.remove_tree(self._temp_dir)
      self._temp_dir = None
