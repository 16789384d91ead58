"""Which `tf.distribute` strategy a process needs, and building it.

`choose_strategy` is a pure function from the cluster role, the requested strategy and the device counts to a
decision with its reason; it is the table the tests pin. `build_strategy` turns a decision into the object, and
must run before any other TensorFlow op (collective ops and logical devices are fixed at program start-up).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

from trainer.core.errors import UserError
from trainer.distribute import cluster as cluster_lib


@dataclasses.dataclass(frozen=True)
class Devices:
  """Accelerators visible to this process."""

  num_gpus: int = 0
  num_cpu_devices: int = 1
  tpu: str | None = None

  @property
  def local_replicas(self) -> int:
    """Replicas one process would run under a mirrored strategy."""
    return self.num_gpus if self.num_gpus else self.num_cpu_devices


@dataclasses.dataclass(frozen=True)
class Strategy:
  """One strategy the trainer builds: a row of `STRATEGIES`. What the rest of the trainer needs to know of a
  strategy is asked of its row, never of its name."""

  name: str  # --strategy's value
  class_name: str  # the tf.distribute class, as --dry_run reports it
  build: Callable[[cluster_lib.ClusterRole, Devices], Any]  # must run before any other TensorFlow op
  replicas: Callable[[cluster_lib.ClusterRole, Devices], int]  # replicas that share one global batch step
  # --strategy may name it for one process (no cluster) although auto would pick another.
  one_process: bool = False
  multi_process: bool = False  # replicas in more than one process: the loop's collectives or schedules span them
  # Training is coordinated by the chief and runs on workers (ClusterCoordinator), not in lockstep.
  parameter_server: bool = False
  # Every worker runs each step's collectives in lockstep: a decision made on one process (save now) must be
  # agreed by all, and a lost peer fails the others' next collective.
  lockstep_peers: bool = False
  # Keras 3's model.fit under it: the issue that says why it fails (None: it works).
  keras3_fit_issue: str | None = None


def _build_default(role, devices):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  return tf.distribute.get_strategy()


def _build_one_device(role, devices):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  return tf.distribute.OneDeviceStrategy("/gpu:0" if devices.num_gpus else "/cpu:0")


def _build_mirrored(role, devices):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  if devices.num_gpus:
    return tf.distribute.MirroredStrategy()
  return tf.distribute.MirroredStrategy(devices=[d.name for d in tf.config.list_logical_devices("CPU")])


def _build_multi_worker_mirrored(role, devices):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  resolver = cluster_resolver(role) if role.cluster else None
  if devices.num_cpu_devices > 1 and not devices.num_gpus:
    return _logical_cpu_multi_worker_strategy(resolver, communication_options(devices), devices.num_cpu_devices)
  return tf.distribute.MultiWorkerMirroredStrategy(cluster_resolver=resolver,
                                                  communication_options=communication_options(devices))


def _build_parameter_server(role, devices):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  return tf.distribute.experimental.ParameterServerStrategy(cluster_resolver(role))


def _build_tpu(role, devices):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu="" if devices.tpu == "local" else devices.tpu)
  tf.config.experimental_connect_to_cluster(resolver)
  tf.tpu.experimental.initialize_tpu_system(resolver)
  return tf.distribute.TPUStrategy(resolver)


def _one_replica(role, devices):
  return 1


def _local_replicas(role, devices):
  return devices.local_replicas


def _every_workers_replicas(role, devices):
  # Each worker's GPUs, or its logical CPU devices (`_logical_cpu_multi_worker_strategy` makes them count, as a
  # worker's GPUs do).
  return role.num_workers * devices.local_replicas


STRATEGIES: dict[str, Strategy] = {row.name: row for row in (
    Strategy("default", "default", _build_default, _one_replica, one_process=True),
    Strategy("one_device", "OneDeviceStrategy", _build_one_device, _one_replica, one_process=True),
    Strategy("mirrored", "MirroredStrategy", _build_mirrored, _local_replicas, one_process=True),
    Strategy("multi_worker_mirrored", "MultiWorkerMirroredStrategy", _build_multi_worker_mirrored,
             _every_workers_replicas, one_process=True, multi_process=True, lockstep_peers=True,
             keras3_fit_issue="keras-team/keras#20585"),
    Strategy("parameter_server", "ParameterServerStrategy", _build_parameter_server, _local_replicas,
             multi_process=True, parameter_server=True, keras3_fit_issue="keras-team/keras#18624"),
    # A TPU's cores are not counted here (TPUStrategy knows them once built): --global_batch_size is not checked
    # against them.
    Strategy("tpu", "TPUStrategy", _build_tpu, _one_replica),
)}


@dataclasses.dataclass(frozen=True)
class StrategyChoice:
  name: str  # a key of STRATEGIES
  reason: str

  @property
  def kind(self) -> Strategy:
    return STRATEGIES[self.name]

  @property
  def class_name(self) -> str:
    return self.kind.class_name

  @property
  def parameter_server(self) -> bool:
    return self.kind.parameter_server

  @property
  def multi_process(self) -> bool:
    return self.kind.multi_process


def choose_strategy(role: cluster_lib.ClusterRole, requested: str, devices: Devices) -> StrategyChoice:
  """Decides the strategy for this process; raises UserError when `requested` contradicts the cluster."""
  auto = _auto_choice(role, devices)
  if requested == "auto":
    return auto
  if requested not in STRATEGIES:
    raise UserError(f"--strategy={requested!r} is not a strategy; expected one of auto, {', '.join(STRATEGIES)}")
  if requested == auto.name:
    return StrategyChoice(requested, "requested with --strategy; " + auto.reason)
  # Explicit choices that the cluster allows although auto would pick something else.
  single_process = not role.is_multi_worker and not role.num_ps
  if single_process and STRATEGIES[requested].one_process and role.task_type != cluster_lib.EVALUATOR:
    if requested == "one_device" and devices.local_replicas < 1:
      raise UserError("--strategy=one_device needs a device")
    return StrategyChoice(requested, f"requested with --strategy ({devices.local_replicas} local device(s), "
                                     "no multi-worker cluster)")
  if requested == "tpu" and not devices.tpu:
    raise UserError("--strategy=tpu but no TPU is configured; set --tpu (or TPU_NAME), or use --strategy=auto")
  raise UserError(f"--strategy={requested} contradicts the cluster ({_describe(role)}), which calls for "
                  f"{auto.name}; use --strategy=auto or --strategy={auto.name}")


def _auto_choice(role: cluster_lib.ClusterRole, devices: Devices) -> StrategyChoice:
  if role.task_type == cluster_lib.EVALUATOR:
    return StrategyChoice("default", "evaluator task: side-car evaluation of the chief's checkpoints, "
                                     "outside the training cluster")
  if role.num_ps:
    return StrategyChoice("parameter_server", f"cluster has {role.num_ps} parameter server(s) and "
                                              f"{role.num_workers} training process(es)")
  if devices.tpu:
    return StrategyChoice("tpu", f"TPU {devices.tpu!r} configured")
  if role.is_multi_worker:
    return StrategyChoice("multi_worker_mirrored", f"cluster has {role.num_workers} training processes "
                                                   "and no parameter server")
  if devices.num_gpus > 1:
    return StrategyChoice("mirrored", f"one process with {devices.num_gpus} GPUs")
  if devices.num_gpus == 1:
    return StrategyChoice("one_device", "one process with 1 GPU")
  if devices.num_cpu_devices > 1:
    return StrategyChoice("mirrored", f"one process with {devices.num_cpu_devices} logical CPU devices")
  return StrategyChoice("default", "one process, no GPU")


def _describe(role: cluster_lib.ClusterRole) -> str:
  if not role.cluster:
    return "no cluster: a single process"
  return ", ".join(f"{len(v)} {k}" for k, v in role.cluster.items())


def configure_devices(num_cpu_devices: int) -> Devices:
  """Counts devices and splits the CPU into logical devices. Must run before any other TensorFlow op."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  gpus = tf.config.list_physical_devices("GPU")
  if num_cpu_devices > 1 and not gpus:
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * num_cpu_devices)
  return Devices(num_gpus=len(gpus), num_cpu_devices=num_cpu_devices)


def build_strategy(choice: StrategyChoice, role: cluster_lib.ClusterRole, devices: Devices):
  """Builds the strategy object. For parameter-server jobs call only on the chief (the coordinator)."""
  return choice.kind.build(role, devices)


def _logical_cpu_multi_worker_strategy(resolver, options, num_cpu_devices: int):
  """MultiWorkerMirroredStrategy with one replica per logical CPU device of each worker, as a worker with that
  many GPUs runs on Vertex: TensorFlow counts one CPU device a worker whatever the logical devices
  (`CollectiveAllReduceExtended._initialize_local_devices`), so a local rehearsal of a "2-GPU" worker would run
  half the replicas, with another per-replica batch. The class's one device-counting method is overridden, as
  Habana's HPUStrategy overrides it for its devices; everything else (collectives, input sharding by worker,
  checkpoints) is TensorFlow's own."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from tensorflow.python.distribute import collective_all_reduce_strategy as collective  # pylint: disable=g-import-not-at-top
  from tensorflow.python.distribute import distribute_lib  # pylint: disable=g-import-not-at-top

  class LogicalCpuExtended(collective.CollectiveAllReduceExtended):

    def _initialize_local_devices(self, cluster_resolver, worker_device):
      return tuple(f"{worker_device}/device:CPU:{i}" for i in range(num_cpu_devices)), "CPU"

  class LogicalCpuMultiWorkerMirroredStrategy(tf.distribute.MultiWorkerMirroredStrategy):

    def __init__(self):  # pylint: disable=super-init-not-called
      distribute_lib.Strategy.__init__(  # pylint: disable=non-parent-init-called
          self, LogicalCpuExtended(self, cluster_resolver=resolver, communication_options=options))

  return LogicalCpuMultiWorkerMirroredStrategy()


GRADIENT_PACK_BYTES = 32 * 1024 * 1024  # gradients all-reduced in packs of up to this size


def communication_options(devices: Devices):
  """MultiWorkerMirroredStrategy's all-reduce: NCCL with gradients packed into 32 MiB all-reduces on GPUs (many
  small all-reduces are latency-bound across machines), TensorFlow chooses on CPUs (its ring collectives; NCCL needs GPUs)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  implementations = tf.distribute.experimental.CommunicationImplementation
  if devices.num_gpus:
    return tf.distribute.experimental.CommunicationOptions(implementation=implementations.NCCL,
                                                           bytes_per_pack=GRADIENT_PACK_BYTES)
  return tf.distribute.experimental.CommunicationOptions(implementation=implementations.AUTO)


def cluster_resolver(role: cluster_lib.ClusterRole):
  """A resolver built from the parsed role, so TensorFlow never re-reads (or misreads) TF_CONFIG."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  spec = tf.train.ClusterSpec(role.tf_cluster_dict())
  return tf.distribute.cluster_resolver.SimpleClusterResolver(
      spec, task_type=role.task_type, task_id=role.task_index, rpc_layer="grpc")
