"""The plan of one process: its cluster role, devices and strategy, and the checks on their combination.

Pure: no TensorFlow, no storage. `make_plan` is what `--dry_run` prints, and the combinations that cannot work
(batch not divisible by the replicas, Keras 3 `fit` under multi-process strategies, parameter servers without a
chief, ...) fail here in one line, before anything is read or started.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from trainer.core import config as config_lib
from trainer.core.errors import UserError
from trainer.distribute import cluster as cluster_lib
from trainer.distribute import strategy as strategy_lib


@dataclasses.dataclass(frozen=True)
class Plan:
  """What this process will do, as --dry_run reports it."""

  role: cluster_lib.ClusterRole
  devices: strategy_lib.Devices
  choice: strategy_lib.StrategyChoice
  keras_version: str

  def to_dict(self, config: config_lib.Config) -> dict[str, Any]:
    return {
        "task_type": self.role.task_type,
        "task_index": self.role.task_index,
        "is_chief": self.role.is_chief,
        "num_workers": self.role.num_workers,
        "num_ps": self.role.num_ps,
        "cluster_source": self.role.source,
        "strategy": self.choice.class_name,
        "strategy_reason": self.choice.reason,
        "num_replicas": replicas(self),
        "loop": config.train.loop,
        "keras_version": self.keras_version,
        "model_dir": config.output.model_dir,
        "checkpoint_dir": config.output.checkpoint_dir,
        "tensorboard_dir": config.output.tensorboard_dir,
        "train_data": config.data.train_pattern,
        "eval_data": config.data.eval_pattern,
    }


def replicas(plan: Plan) -> int:
  """Replicas that share one global batch step."""
  return plan.choice.kind.replicas(plan.role, plan.devices)


def make_plan(config: config_lib.Config, env: config_lib.Environment, *, num_gpus: int,
              keras_version: str) -> Plan:
  """Pure: resolves role and strategy and checks the combinations that cannot work."""
  role = cluster_lib.resolve_role(tf_config=env.tf_config, cluster_spec=env.cluster_spec)
  if config.distribution.reduction_server:
    role = cluster_lib.without_parameter_servers(role)
  devices = strategy_lib.Devices(num_gpus=num_gpus, num_cpu_devices=config.distribution.num_cpu_devices,
                                 tpu=config.distribution.tpu)
  choice = strategy_lib.choose_strategy(role, config.distribution.strategy, devices)
  plan = Plan(role=role, devices=devices, choice=choice, keras_version=keras_version)
  train = config.train
  num_replicas = replicas(plan)
  if train.global_batch_size % num_replicas:
    raise UserError(f"--global_batch_size={train.global_batch_size} is not divisible by the {num_replicas} "
                    f"replicas of {choice.class_name}; use a multiple of {num_replicas}")
  if train.loop == "fit" and choice.kind.keras3_fit_issue and keras_version.startswith("3."):
    raise UserError(f"--loop=fit does not work under {choice.class_name} with Keras {keras_version} "
                    f"({choice.kind.keras3_fit_issue}); "
                    "use --loop=custom, or install tf_keras and set TF_USE_LEGACY_KERAS=1")
  if train.jit_compile and train.loop == "fit" and num_replicas > 1 and not devices.num_gpus:
    # Keras compiles its whole step, the cross-device update included; over CPU devices XLA fails with "Trying to
    # access resource ... located in device CPU:1 from device CPU:0" (TF 2.21, Keras 3.15).
    raise UserError(f"--jit_compile with --loop=fit cannot compile Keras' step over {num_replicas} CPU replicas "
                    "(XLA cannot reach the other devices' variables); use --loop=custom, which compiles the forward "
                    "and backward pass, or drop --jit_compile")
  if choice.parameter_server and not role.cluster.get(cluster_lib.CHIEF):
    raise UserError("a cluster with parameter servers needs a chief (Vertex workerpool0) to coordinate "
                    f"training; got {', '.join(role.cluster)}")
  if train.hypertune_metric and (not config.data.eval_pattern or train.eval_steps == 0):
    # Checked here, not after training: a tuning trial must not train for nothing and fail at the end.
    raise UserError(f"--hypertune_metric={train.hypertune_metric} needs evaluation: set --eval_data (or "
                    "AIP_VALIDATION_DATA_URI) and leave --eval_steps above 0")
  if train.eval_every_steps and (not config.data.eval_pattern or train.eval_steps == 0):
    raise UserError(f"--eval_every_steps={train.eval_every_steps} needs evaluation: set --eval_data (or "
                    "AIP_VALIDATION_DATA_URI) and leave --eval_steps above 0")
  if config.data.deterministic and choice.parameter_server:
    raise UserError("--deterministic_input cannot make ParameterServerStrategy reproducible: its workers read and "
                    "update asynchronously, in an order no seed fixes; drop the flag, or train under a synchronous "
                    "strategy (default, mirrored, multi_worker_mirrored)")
  if train.run_eagerly and choice.parameter_server:
    raise UserError("--run_eagerly cannot run under ParameterServerStrategy (ClusterCoordinator schedules only "
                    "tf.functions); debug eagerly with --strategy=default on one process")
  return plan
