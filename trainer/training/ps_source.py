"""The loop's source under ParameterServerStrategy: the chief schedules closures of several steps on the workers
through a `ClusterCoordinator` and waits for them all, so a checkpoint holds every step before it. A lost parameter
server (its variables gone) ends the chief with `ExternalFailure`, naming the server, so Vertex restarts the job.
No TensorFlow at import time.
"""

from __future__ import annotations

import math
import re
from typing import Callable

from absl import logging

from trainer.core.errors import EXIT_EXTERNAL_FAILURE
from trainer.core.errors import ExternalFailure
from trainer.core.errors import first_line
from trainer.distribute import cluster as cluster_lib
from trainer.planning.job import Job
from trainer.training import steps


def closure_sizes(num: int, *, steps_per_loop: int, num_workers: int) -> list[int]:
  """How `num` steps are split into closures for the parameter-server workers: at most `--steps_per_loop`
  steps each, and enough closures to keep every worker busy."""
  per_closure = min(steps_per_loop, max(1, math.ceil(num / max(1, num_workers))))
  sizes = [per_closure] * (num // per_closure)
  return sizes + [num % per_closure] if num % per_closure else sizes


def coordinated_steps(job: Job, replica_step: Callable, optimizer,
                       start_step: int) -> Callable[[int], tuple[int, float]]:
  """The loop's source under ParameterServerStrategy: the chief schedules closures of several steps on the
  workers (`closure_sizes`) and waits for them all, so checkpoints hold every step before them.

  The optimizer's step counter on the parameter servers is not the count of steps run: a worker lost in the
  middle of a closure has applied some of its steps when the coordinator runs the whole closure again on another
  worker (a step counted twice), and Keras 3 increments the counter as a read then a write, so workers updating
  it at once lose increments (measured: 584 of 600 steps counted with 2 workers). The updates themselves cannot
  be taken back (asynchronous training tolerates them), but the count can: after each chunk it is set to the
  steps scheduled, so the run ends at exactly --train_steps and checkpoints are named for the steps they hold.
  """
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  strategy = job.strategy
  coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
  num_workers = len(job.role.cluster.get(cluster_lib.WORKER, ()))
  dataset_fn = job.dataset_fn("train")

  @tf.function
  def per_worker_dataset():
    return strategy.distribute_datasets_from_function(dataset_fn)

  iterator = iter(coordinator.create_per_worker_dataset(per_worker_dataset))
  train_steps = steps.steps_fn(strategy, replica_step)
  steps_per_loop = job.config.train.steps_per_loop
  logging.info("Parameter servers: each chunk is scheduled as closures of up to %d steps (--steps_per_loop) over "
               "%d worker(s)", steps_per_loop, num_workers)

  scheduled = start_step

  def advance(num: int) -> tuple[int, float]:
    nonlocal scheduled
    sizes = closure_sizes(num, steps_per_loop=steps_per_loop, num_workers=num_workers)
    results = [coordinator.schedule(train_steps, args=(iterator, tf.constant(size))) for size in sizes]
    try:
      with job.reading_data():
        coordinator.join()
    except (tf.errors.UnavailableError, tf.errors.AbortedError, tf.errors.CancelledError) as e:
      # The coordinator survives lost workers by itself; what reaches here is a lost parameter server, whose
      # variables are gone: only a restart of the job (from the last checkpoint) can go on.
      raise ExternalFailure(f"{_lost_peers(e, job.role)} was lost after step {scheduled} ({_error_detail(e)}); "
                            f"this chief exits {EXIT_EXTERNAL_FAILURE} so that Vertex restarts the job, which "
                            f"resumes from the last checkpoint in {job.config.output.checkpoint_dir}") from None
    scheduled += num
    counted = int(optimizer.iterations.numpy())
    if counted > scheduled:
      logging.warning("A worker was lost during a closure: %d step(s) it had applied ran again on another worker; "
                      "the step count is set back from %d to %d", counted - scheduled, counted, scheduled)
    elif counted < scheduled:
      logging.info("The parameter servers counted %d of %d steps (workers' increments interleaved); the step "
                   "count is set to %d", counted, scheduled, scheduled)
    if counted != scheduled:
      optimizer.iterations.assign(scheduled)
    return num, sum(float(r.fetch()) for r in results) / num

  return advance


def _lost_peers(error: Exception, role: cluster_lib.ClusterRole) -> str:
  """The parameter servers an error names by address or task, e.g. "parameter server ps:0 (127.0.0.1:2222)"."""
  text = str(getattr(error, "message", "") or error)
  named = [f"{cluster_lib.PS}:{index} ({address})" for index, address in enumerate(role.cluster.get(cluster_lib.PS, ()))
           if address in text or f"/job:{cluster_lib.PS}/replica:0/task:{index}" in text]
  return "parameter server " + ", ".join(named) if named else "a parameter server"


def _error_detail(error: Exception) -> str:
  """The line of a TensorFlow error that says what failed (its first line is often "Graph execution error:")."""
  text = str(getattr(error, "message", "") or error)
  found = re.search(r"\b(UNAVAILABLE|ABORTED|CANCELLED|DEADLINE_EXCEEDED):\s*(.+)", text)
  return f"{found.group(1)}: {found.group(2).strip()[:200]}" if found else first_line(error)
