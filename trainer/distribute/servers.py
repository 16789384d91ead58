"""The server side of a parameter-server job: workers and parameter servers host variables and run what the
chief (the coordinator) schedules, until the job ends."""

from __future__ import annotations

from absl import logging

from trainer.distribute import cluster as cluster_lib
from trainer.distribute import preemption


def serve_forever(role: cluster_lib.ClusterRole) -> None:
  """A parameter-server job's worker or ps: host variables and run what the chief schedules until stopped."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  server = tf.distribute.Server(tf.train.ClusterSpec(role.tf_cluster_dict()), job_name=role.task_type,
                                task_index=role.task_index, protocol="grpc", start=True)
  preemption.release_sigterm("while the server started")  # SIGTERM ends a server at once: it holds no state of its own
  logging.info("Serving %s:%d at %s until the job ends", role.task_type, role.task_index, server.target)
  server.join()
