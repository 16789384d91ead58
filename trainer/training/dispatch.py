"""Training under a `tf.distribute` strategy: `train(job)` runs the loop --loop names.

    custom_loop   `strategy.run` steps driven by `loop.run` (every strategy)
    fit_loop      Keras `model.fit`, an adapter onto the same actions
    training_session  what both share: restore, writers, periodic evaluation, the final evaluation
    actions       the one list of periodic actions (log, checkpoint, evaluation, loss guard, preemption)
    steps         the distributed step and the synchronous source; ps_source the parameter-server source
"""

from __future__ import annotations

from trainer.planning.job import Job
from trainer.planning.job import TrainResult


def train(job: Job) -> TrainResult:
  """Trains with the loop `job.config.train.loop` names, from the last checkpoint to the final step."""
  if job.config.train.loop == "fit":
    from trainer.training.fit_loop import fit_loop  # pylint: disable=g-import-not-at-top

    return fit_loop(job)
  from trainer.training.custom_loop import custom_loop  # pylint: disable=g-import-not-at-top

  return custom_loop(job)
