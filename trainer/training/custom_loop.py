"""The custom loop, under every strategy: `strategy.run` steps driven by `loop.run`, several steps per call (a
`tf.function` under synchronous strategies, closures on the workers under parameter servers), the standard actions
fired after every chunk. No TensorFlow at import time.
"""

from __future__ import annotations

from trainer.distribute import preemption
from trainer.modeling import models
from trainer.planning.job import Job
from trainer.planning.job import TrainResult
from trainer.training import actions as actions_lib
from trainer.training import loop as loop_lib
from trainer.training import ps_source
from trainer.training import steps
from trainer.training.training_session import TrainingSession


def custom_loop(job: Job) -> TrainResult:
  """Trains from the last checkpoint (or step 0) to the final step, then evaluates once (`TrainingSession`)."""
  cfg = job.config.train
  model, optimizer = steps.build_model_and_optimizer(job)
  with TrainingSession(job, model, optimizer) as session:
    replica_step = steps.replica_step(model, optimizer, steps.train_objective(job, model),
                                      names=models.input_names(model), global_batch_size=cfg.global_batch_size,
                                      jit_compile=cfg.jit_compile)
    parameter_server = job.choice.parameter_server
    if parameter_server:
      advance = ps_source.coordinated_steps(job, replica_step, optimizer, session.start_step)
    else:
      advance = steps.synchronous_steps(job, replica_step)
    with preemption.SigtermWatcher() as watcher:
      # Under parameter servers a chunk spans closures on every worker; each stays within steps_per_loop.
      state = loop_lib.run(start_step=session.start_step, total_steps=session.total_steps, advance=advance,
                           actions=session.actions(watcher),
                           max_steps_per_call=None if parameter_server else cfg.steps_per_loop,
                           agree=actions_lib.agreement(job), stop=session.stopped_early)
    return session.finish(train_loss=state.loss)
