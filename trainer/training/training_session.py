"""What both loops share around their steps: the restore, the metric writer, the periodic evaluation, the one list of
actions (`actions.standard_actions`), and at the end the final evaluation and the `TrainResult`.

    model, optimizer = steps.build_model_and_optimizer(job)
    with TrainingSession(job, model, optimizer) as session:
      ...advance from session.start_step to session.total_steps, firing session.actions(watcher)...
      return session.finish(train_loss=...)

No TensorFlow at import time.
"""

from __future__ import annotations

from typing import Any

from absl import logging

from trainer.core import progress as progress_lib
from trainer.core import writers
from trainer.distribute import preemption
from trainer.modeling import objective as objective_lib
from trainer.planning.job import Job
from trainer.planning.job import TrainResult
from trainer.training import actions as actions_lib
from trainer.training import checkpoints
from trainer.training import evaluation
from trainer.training import loop as loop_lib
from trainer.training import profiling


class TrainingSession:
  """One run of a loop over `model` and `optimizer` (built under the strategy's scope); a context manager that
  closes the checkpoint keeper, the writers and the periodic evaluation however the run ends."""

  def __init__(self, job: Job, model: Any, optimizer: Any):
    import tensorflow as tf  # pylint: disable=g-import-not-at-top

    self.job, self.model, self.optimizer = job, model, optimizer
    self.objective = objective_lib.Objective(job.schema)
    # All workers save (MultiWorkerMirroredStrategy needs every one to); the chief's land in the checkpoint dir.
    self.keeper = checkpoints.CheckpointKeeper(tf.train.Checkpoint(model=model, optimizer=optimizer),
                                               directory=job.config.output.checkpoint_dir, is_chief=job.is_chief)
    self.writer: writers.MetricWriter | None = None
    self.periodic: evaluation.PeriodicEvaluation | None = None
    self.profile: profiling.ProfileWindow | None = None  # --profile_steps, made with the actions
    self.start_step = 0

  def __enter__(self) -> "TrainingSession":
    try:
      self.start_step = self._resume()
      # Progress from the start step on every process; TensorBoard files from the chief only.
      progress = progress_lib.ProgressReporter(self.job.train_steps, start_step=self.start_step,
                                               interactive=self.job.interactive)
      self.writer = writers.MetricWriter(self.job.config.output.tensorboard_dir, enabled=self.job.is_chief,
                                         progress=progress)
      self.periodic = self._periodic_evaluation()
      self.log = actions_lib.TrainLog(self.writer, self.optimizer,
                                      global_batch_size=self.job.config.train.global_batch_size,
                                      start_step=self.start_step)
    except BaseException:
      self.close()
      raise
    return self

  def __exit__(self, *exc_info) -> None:
    self.close()

  @property
  def total_steps(self) -> int:
    """The step to train to: --train_steps, or where a run that stopped early (and was restarted) stopped."""
    return self.start_step if self.stopped_early() else self.job.train_steps

  def stopped_early(self) -> bool:
    return self.periodic is not None and self.periodic.stopped

  def actions(self, watcher: preemption.SigtermWatcher | None) -> list[loop_lib.PeriodicAction]:
    actions = actions_lib.standard_actions(self.job, model=self.model, keeper=self.keeper, log=self.log,
                                           guard=actions_lib.LossGuard(self.start_step), periodic=self.periodic,
                                           watcher=watcher)
    profile_steps = self.job.config.train.profile_steps
    if profile_steps:  # last: a checkpoint or evaluation due at START is not in the trace
      self.profile = profiling.ProfileWindow(start=profile_steps[0], end=profile_steps[1], enabled=self.job.is_chief,
                                             log_dir=self.job.config.output.tensorboard_dir)
      self.profile.begin(self.start_step, self.total_steps)
      actions.append(self.profile)
    return actions

  def finish(self, *, train_loss: float | None) -> TrainResult:
    """After the loop: the early stop's checkpoint, the final evaluation, the result."""
    final_step = int(self.optimizer.iterations.numpy())
    if final_step < self.job.train_steps:
      actions_lib.guarded_save(self.keeper, self.model, final_step)  # stopped early: a restart finds it done here
    eval_metrics = self._final_evaluation(final_step)
    test_metrics = self._test_evaluation(final_step)
    return TrainResult(final_step=final_step, resumed_from_step=self.start_step, train_loss=train_loss,
                       examples_per_sec=self.log.examples_per_sec, eval_metrics=eval_metrics, model=self.model,
                       test_metrics=test_metrics)

  def close(self) -> None:
    if self.profile is not None:
      self.profile.close()
    if self.periodic is not None:
      self.periodic.close()
    if self.writer is not None:
      self.writer.close()
    self.keeper.close()

  def _resume(self) -> int:
    """Restores the latest checkpoint and returns its step; one at --train_steps means a finished run."""
    job = self.job
    self.keeper.restore_latest()
    start_step = int(self.optimizer.iterations.numpy())
    checkpoints.check_resume_step(start_step, job.train_steps, directory=job.config.output.checkpoint_dir)
    if start_step == job.train_steps:
      logging.info("The checkpoint in %s is at the final step %d: training is done, evaluating and exporting it",
                   job.config.output.checkpoint_dir, start_step)
    elif start_step:
      logging.info("Resuming at step %d of %d", start_step, job.train_steps)
    return start_step

  def _periodic_evaluation(self) -> evaluation.PeriodicEvaluation | None:
    job = self.job
    if not job.config.train.eval_every_steps:
      return None
    periodic = evaluation.PeriodicEvaluation(job, self.model, self.objective, self.writer,
                                             report=job.report_eval if job.is_chief else None)
    if periodic.stopped:
      logging.info("This run stopped early at step %d (%s): it trains no further; evaluating and exporting",
                   periodic.best.stopped_at, evaluation.BEST_FILE)
    return periodic

  def _test_evaluation(self, final_step: int) -> dict[str, float]:
    """One pass over --test_data with the weights that will be exported (never seen by early stopping or
    --export=best, which look at the eval data only)."""
    if not self.job.test_files:
      return {}
    self.job.peers_moved("the test pass")
    metrics = evaluation.evaluate(self.job, self.model, self.objective, split="test")
    self.writer.write("test", final_step, metrics)
    return metrics

  def _final_evaluation(self, final_step: int) -> dict[str, float]:
    """The metrics of the weights that will be exported: the best evaluation's under --export=best, the
    periodic evaluation of the final step when there was one, else one more pass."""
    periodic = self.periodic
    if periodic is not None:
      best = periodic.restore_best(final_step)
      if best is not None:
        return best
      if periodic.last_step == final_step:
        return periodic.last_metrics
    self.job.peers_moved("the evaluation pass")
    metrics = evaluation.evaluate(self.job, self.model, self.objective)
    if metrics:
      self.writer.write("eval", final_step, metrics)
    return metrics
