"""Side-car evaluation: the evaluator task (Vertex pool 3) evaluates each checkpoint the chief writes.

It ends when it has evaluated the checkpoint of the final training step, or when no new checkpoint arrives
within `timeout_secs` (the chief died or finished long ago).
"""

from __future__ import annotations

from absl import logging

from trainer import summaries as summaries_lib
from trainer import training


def run_sidecar(job: training.Job, *, timeout_secs: float = 600.0, poll_secs: float = 1.0) -> dict:
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  with job.strategy.scope():
    model = job.build_model()
  objective = training.Objective(job.schema)
  # Only the model is read; the optimizer's slots stay in the file (expect_partial). The trainer numbers
  # checkpoints by global step (ckpt-<step>), which tells the evaluator how far training got.
  checkpoint = tf.train.Checkpoint(model=model)
  summaries = summaries_lib.Summaries(job.config.output.tensorboard_dir, enabled=True, splits=("eval_sidecar",))
  metrics = {}
  checkpoint_dir = job.config.output.checkpoint_dir
  logging.info("Evaluator: watching %s for checkpoints (up to step %d)", checkpoint_dir, job.train_steps)
  for path in tf.train.checkpoints_iterator(checkpoint_dir, min_interval_secs=poll_secs, timeout=timeout_secs):
    try:
      checkpoint.restore(path).expect_partial()
    except (tf.errors.NotFoundError, tf.errors.DataLossError):
      logging.warning("Evaluator: %s vanished before it was read (pruned); waiting for the next", path)
      continue
    metrics = training.evaluate(job, model, objective)
    current = int(path.rsplit("-", 1)[-1])
    summaries.scalars("eval_sidecar", current, metrics)
    logging.info("Evaluator: step %d %s", current, metrics)
    if current >= job.train_steps:
      break
  else:
    logging.warning("Evaluator: no new checkpoint in %.0f s; stopping", timeout_secs)
  summaries.close()
  return metrics
