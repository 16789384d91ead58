"""Evaluation: one exact pass over the eval data under any strategy; periodic evaluation during training
(--eval_every_steps) with early stopping and the best weights kept (--export=best); and the side-car evaluator
(Vertex pool 3) that evaluates each checkpoint the chief writes, driven by the same outer loop as training."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

from absl import logging

from trainer.core import paths
from trainer.core import storage
from trainer.core import writers
from trainer.modeling import models
from trainer.modeling import objective as objective_lib
from trainer.modeling import recipe
from trainer.training import checkpoints
from trainer.training import loop as loop_lib

BEST_DIR = "best"  # under the checkpoint dir: the best evaluation's weights and best.json
BEST_FILE = "best.json"


def evaluate(job, model, objective: objective_lib.Objective, *, split: str = "eval") -> dict[str, float]:
  """Loss and accuracy (or MAE) over one pass of the eval data (or --eval_steps batches), or of the test data
  (`split="test"`: always exactly one pass); {} when there is none.

  Every example counts once, the partial last batch included, under every strategy: `examples` is the true
  count. The sums are reduced across replicas (and workers) before dividing, so the metrics are exact means.

  Args:
    job: the `job.Job` (its strategy, eval files and config).
    model: the Keras model, built under `job.strategy.scope()`.
    objective: the task's loss and metric sums.

  Returns:
    {"loss", "accuracy" or "mae", "examples"}, or {} without eval data or with --eval_steps=0.
  """
  if split == "eval" and (not job.eval_files or job.config.train.eval_steps == 0):
    return {}
  if split == "test" and not job.test_files:
    return {}
  names = models.input_names(model)

  def batch_sums(features, labels):
    return objective.batch_sums(labels, model(models.select_inputs(features, names), training=False))

  with job.reading_data(split):
    sums, batches = _eval_pass(job, objective, batch_sums, split=split)
  metrics = objective.finalize(sums.numpy())
  logging.info("%s over %d batches: %s", "Eval" if split == "eval" else "Test", batches, metrics)
  return metrics


def _eval_pass(job, objective: objective_lib.Objective, batch_sums, *, split: str):
  """The summed metrics over the eval data and the number of batches (per process)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  strategy = job.strategy
  if job.choice.parameter_server:
    # Inline evaluation on the coordinator: variables are read from the parameter servers.
    eval_batch = tf.function(batch_sums)
    sums, batches = tf.zeros([objective.num_sums]), 0
    for features, labels in job.dataset_fn(split)(None):
      sums += eval_batch(features, labels)
      batches += 1
    return sums, batches

  @tf.function
  def eval_pass(dataset):
    total, steps = tf.zeros([objective.num_sums]), tf.constant(0)
    for features, labels in dataset:  # ends together on every worker (empty batches pad the short ones)
      total += strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(batch_sums, args=(features, labels)),
                               axis=None)
      steps += 1
    return total, steps

  sums, batches = eval_pass(strategy.distribute_datasets_from_function(job.dataset_fn(split)))
  return sums, int(batches)


@dataclasses.dataclass
class BestSoFar:
  """The best periodic evaluation so far, kept in best.json beside the best weights so a restarted run goes on
  comparing against it (and does not train again after it stopped early)."""

  metric: str
  step: int | None = None
  value: float | None = None
  metrics: dict[str, float] = dataclasses.field(default_factory=dict)
  evaluations_since_best: int = 0
  stopped_at: int | None = None

  @classmethod
  def load(cls, directory: str, metric: str) -> "BestSoFar":
    path = paths.join_path(directory, BEST_FILE)
    import tensorflow as tf  # pylint: disable=g-import-not-at-top

    if not tf.io.gfile.exists(path):
      return cls(metric)
    stored = storage.read_json(path)
    if stored.get("metric") != metric:
      logging.warning("%s compared by %s; this run compares by %s: starting the comparison over", path,
                      stored.get("metric"), metric)
      return cls(metric)
    return cls(**stored)

  def improved_by(self, value: float) -> bool:
    if self.value is None:
      return True
    return value > self.value if recipe.higher_is_better(self.metric) else value < self.value


class PeriodicEvaluation:
  """The loop action of --eval_every_steps: one exact evaluation pass (every worker takes part: under
  MultiWorkerMirroredStrategy it is collective), its metrics to TensorBoard and, on the chief, to the
  hyperparameter-tuning file at that step; then early stopping and the best weights.

  Every process sees the same all-reduced metrics, so every process takes the same decision to stop, at the
  same step, without another collective.
  """

  def __init__(self, job, model, objective: objective_lib.Objective, writer: writers.MetricWriter, *,
               report: Callable[[dict[str, Any], int], None] | None):
    import tensorflow as tf  # pylint: disable=g-import-not-at-top

    train = job.config.train
    self._job, self._model, self._objective, self._writer, self._report = job, model, objective, writer, report
    self._patience = train.early_stopping_patience if train.early_stopping_metric else None
    self._directory = paths.join_path(job.config.output.checkpoint_dir, BEST_DIR)
    self.best = BestSoFar.load(self._directory, train.early_stopping_metric or "loss")
    self._keeper = None
    if train.export == "best":
      self._keeper = checkpoints.CheckpointKeeper(tf.train.Checkpoint(model=model), directory=self._directory,
                                                  is_chief=job.is_chief, max_to_keep=1)
    self.last_step: int | None = None
    self.last_metrics: dict[str, float] = {}

  @property
  def stopped(self) -> bool:
    return self.best.stopped_at is not None

  def __call__(self, state: loop_lib.LoopState) -> None:
    metrics = evaluate(self._job, self._model, self._objective)
    self.last_step, self.last_metrics = state.step, metrics
    self._writer.write("eval", state.step, metrics)
    if self._report is not None:
      self._report({f"eval_{k}": v for k, v in metrics.items()}, state.step)
    best, value = self.best, metrics[self.best.metric]
    if best.improved_by(value):
      best.step, best.value, best.metrics, best.evaluations_since_best = state.step, value, metrics, 0
      if self._keeper is not None:
        self._keeper.save(state.step)
    else:
      best.evaluations_since_best += 1
    if self._patience and best.evaluations_since_best >= self._patience and state.step < self._job.train_steps:
      best.stopped_at = state.step
      logging.info("Early stopping at step %d: eval %s has not improved on %.6g (step %d) in %d evaluation(s)",
                   state.step, best.metric, best.value, best.step, best.evaluations_since_best)
    if self._job.is_chief:
      storage.write_json(paths.join_path(self._directory, BEST_FILE), dataclasses.asdict(best))

  def restore_best(self, final_step: int) -> dict[str, float] | None:
    """With --export=best, loads the best evaluation's weights into the model; returns its metrics (None when
    the final weights are the best, or nothing was evaluated)."""
    if self._keeper is None or self.best.step is None or self.best.step == final_step:
      return None
    self._keeper.restore_latest()
    logging.info("--export=best: exporting the weights of step %d (eval %s %.6g), not of the final step %d",
                 self.best.step, self.best.metric, self.best.value, final_step)
    return dict(self.best.metrics)

  def close(self) -> None:
    if self._keeper is not None:
      self._keeper.close()


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
