"""Evaluation: one exact pass over the eval data under any strategy, and the side-car evaluator (Vertex pool 3)
that evaluates each checkpoint the chief writes, driven by the same outer loop as training."""

from __future__ import annotations

from absl import logging

from trainer import loop as loop_lib
from trainer import models
from trainer import objective as objective_lib
from trainer import writers


def evaluate(job, model, objective: objective_lib.Objective) -> dict[str, float]:
  """Loss and accuracy (or MAE) over one pass of the eval data (or --eval_steps batches); {} when skipped.

  Every example counts once, the partial last batch included, under every strategy: `examples` is the true
  count. The sums are reduced across replicas (and workers) before dividing, so the metrics are exact means.

  Args:
    job: the `training.Job` (its strategy, eval files and config).
    model: the Keras model, built under `job.strategy.scope()`.
    objective: the task's loss and metric sums.

  Returns:
    {"loss", "accuracy" or "mae", "examples"}, or {} without eval data or with --eval_steps=0.
  """
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  if not job.eval_files or job.config.train.eval_steps == 0:
    return {}
  names = models.input_names(model)
  strategy = job.strategy

  def batch_sums(features, labels):
    return objective.batch_sums(labels, model(models.select_inputs(features, names), training=False))

  if job.choice.parameter_server:
    # Inline evaluation on the coordinator: variables are read from the parameter servers.
    eval_batch = tf.function(batch_sums)
    sums, batches = tf.zeros([3]), 0
    for features, labels in job.dataset_fn("eval")(None):
      sums += eval_batch(features, labels)
      batches += 1
  else:

    @tf.function
    def eval_pass(dataset):
      total, steps = tf.zeros([3]), tf.constant(0)
      for features, labels in dataset:  # ends together on every worker (empty batches pad the short ones)
        total += strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(batch_sums, args=(features, labels)),
                                 axis=None)
        steps += 1
      return total, steps

    sums, batches = eval_pass(strategy.distribute_datasets_from_function(job.dataset_fn("eval")))
    batches = int(batches)
  metrics = objective.finalize(sums.numpy())
  logging.info("Eval over %d batches: %s", batches, metrics)
  return metrics


def run_sidecar(job, *, timeout_secs: float = 600.0, poll_secs: float = 1.0) -> dict:
  """Evaluates every new checkpoint of the chief until the one at the final step.

  The outer loop's source is the checkpoint directory: it advances to each new checkpoint's step (the trainer
  names them ckpt-<step>), or stops when none arrives within `timeout_secs` (the chief died or finished long
  ago). Only the model is restored; the optimizer's slots stay in the file (expect_partial).
  """
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  with job.strategy.scope():
    model = job.build_model()
  objective = objective_lib.Objective(job.schema)
  checkpoint = tf.train.Checkpoint(model=model)
  writer = writers.MetricWriter(job.config.output.tensorboard_dir, enabled=True, splits=("eval_sidecar",))
  checkpoint_dir = job.config.output.checkpoint_dir
  new_checkpoints = iter(tf.train.checkpoints_iterator(checkpoint_dir, min_interval_secs=poll_secs,
                                                       timeout=timeout_secs))
  reached = {"step": 0}
  metrics: dict[str, float] = {}

  def next_checkpoint(_max_steps: int) -> tuple[int, float | None]:
    for path in new_checkpoints:
      step = int(path.rsplit("-", 1)[-1])
      if step <= reached["step"]:
        continue
      try:
        checkpoint.restore(path).expect_partial()
      except (tf.errors.NotFoundError, tf.errors.DataLossError):
        logging.warning("Evaluator: %s vanished before it was read (pruned); waiting for the next", path)
        continue
      done, reached["step"] = step - reached["step"], step
      return done, None
    return 0, None

  def evaluate_checkpoint(state: loop_lib.LoopState) -> None:
    metrics.update(evaluate(job, model, objective))
    writer.write("eval_sidecar", state.step, metrics, label="Evaluator")

  logging.info("Evaluator: watching %s for checkpoints (up to step %d)", checkpoint_dir, job.train_steps)
  try:
    final = loop_lib.run(start_step=0, total_steps=job.train_steps, advance=next_checkpoint,
                         actions=[loop_lib.PeriodicAction("evaluate", evaluate_checkpoint, every_steps=1)])
    if final.step < job.train_steps:
      logging.warning("Evaluator: no new checkpoint in %.0f s; stopping", timeout_secs)
  finally:
    writer.close()
  return metrics
