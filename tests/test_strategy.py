"""The strategy decision table: cluster role x --strategy x devices -> strategy and reason."""

import pytest

from trainer.core.errors import UserError
from trainer.distribute import cluster
from trainer.distribute import strategy

# The quick tier (scripts/test.sh --quick): no test here trains for long or waits on peers.
pytestmark = pytest.mark.quick

LOCAL = cluster.ClusterRole()
MULTI = cluster.ClusterRole("chief", 0, {"chief": ("c:1",), "worker": ("w:1",)}, "TF_CONFIG")
MULTI_WORKER = cluster.ClusterRole("worker", 0, {"chief": ("c:1",), "worker": ("w:1",)}, "TF_CONFIG")
PS = cluster.ClusterRole("chief", 0, {"chief": ("c:1",), "worker": ("w:1",), "ps": ("p:1",)}, "TF_CONFIG")
PS_WORKER = cluster.ClusterRole("ps", 0, {"chief": ("c:1",), "worker": ("w:1",), "ps": ("p:1",)}, "TF_CONFIG")
EVALUATOR = cluster.ClusterRole("evaluator", 0, {"chief": ("c:1",), "worker": ("w:1",)}, "TF_CONFIG")

CPU = strategy.Devices()
CPU4 = strategy.Devices(num_cpu_devices=4)
GPU1 = strategy.Devices(num_gpus=1)
GPU4 = strategy.Devices(num_gpus=4)
TPU = strategy.Devices(tpu="local")


@pytest.mark.parametrize("role,devices,expected,reason", [
    (LOCAL, CPU, "default", "one process, no GPU"),
    (LOCAL, GPU1, "OneDeviceStrategy", "one process with 1 GPU"),
    (LOCAL, GPU4, "MirroredStrategy", "one process with 4 GPUs"),
    (LOCAL, CPU4, "MirroredStrategy", "one process with 4 logical CPU devices"),
    (MULTI, CPU, "MultiWorkerMirroredStrategy", "cluster has 2 training processes and no parameter server"),
    (MULTI_WORKER, GPU4, "MultiWorkerMirroredStrategy", "cluster has 2 training processes"),
    (PS, CPU, "ParameterServerStrategy", "cluster has 1 parameter server(s) and 2 training process(es)"),
    (PS_WORKER, GPU4, "ParameterServerStrategy", "cluster has 1 parameter server(s)"),
    (LOCAL, TPU, "TPUStrategy", "TPU 'local' configured"),
    (EVALUATOR, GPU4, "default", "evaluator task: side-car evaluation"),
])
def test_auto(role, devices, expected, reason):
  choice = strategy.choose_strategy(role, "auto", devices)
  assert choice.class_name == expected
  assert choice.reason.startswith(reason)


@pytest.mark.parametrize("role,requested,devices,expected", [
    (LOCAL, "mirrored", CPU, "MirroredStrategy"),
    (LOCAL, "default", GPU4, "default"),
    (LOCAL, "one_device", GPU4, "OneDeviceStrategy"),
    (LOCAL, "multi_worker_mirrored", CPU, "MultiWorkerMirroredStrategy"),
    (MULTI, "multi_worker_mirrored", CPU, "MultiWorkerMirroredStrategy"),
    (PS, "parameter_server", CPU, "ParameterServerStrategy"),
])
def test_explicit_allowed(role, requested, devices, expected):
  choice = strategy.choose_strategy(role, requested, devices)
  assert choice.class_name == expected
  assert choice.reason.startswith("requested with --strategy")


@pytest.mark.parametrize("role,requested,devices,message", [
    (MULTI, "mirrored", CPU, r"^--strategy=mirrored contradicts the cluster \(1 chief, 1 worker\), which calls for "
                             r"multi_worker_mirrored; use --strategy=auto or --strategy=multi_worker_mirrored$"),
    (LOCAL, "parameter_server", CPU, r"^--strategy=parameter_server contradicts the cluster \(no cluster: a single "
                                     r"process\), which calls for default;"),
    (PS, "multi_worker_mirrored", CPU, r"^--strategy=multi_worker_mirrored contradicts the cluster \(1 chief, 1 "
                                      r"worker, 1 ps\), which calls for parameter_server"),
    (LOCAL, "tpu", CPU, r"^--strategy=tpu but no TPU is configured; set --tpu \(or TPU_NAME\)"),
])
def test_explicit_contradiction(role, requested, devices, message):
  with pytest.raises(UserError, match=message):
    strategy.choose_strategy(role, requested, devices)


def test_tpu_path_reaches_the_resolver():
  """No TPU here: the TPU path must get as far as asking TPUClusterResolver for the named TPU."""
  tf = pytest.importorskip("tensorflow")
  choice = strategy.choose_strategy(LOCAL, "auto", strategy.Devices(tpu="no-such-tpu"))
  assert choice.class_name == "TPUStrategy"
  calls = []
  real = tf.distribute.cluster_resolver.TPUClusterResolver

  class Recording:
    def __init__(self, tpu=None, **kwargs):
      calls.append(tpu)
      raise ValueError("no TPU here")

  tf.distribute.cluster_resolver.TPUClusterResolver = Recording
  try:
    with pytest.raises(ValueError, match="no TPU here"):
      strategy.build_strategy(choice, LOCAL, strategy.Devices(tpu="no-such-tpu"))
  finally:
    tf.distribute.cluster_resolver.TPUClusterResolver = real
  assert calls == ["no-such-tpu"]


def test_a_strategy_is_one_row():
  """What the trainer needs to know of a strategy it asks the strategy's row (`strategy.STRATEGIES`): no module
  but strategy.py compares a strategy's name, so a new strategy is one row there (and --strategy lists it)."""
  import source_checks  # pylint: disable=g-import-not-at-top

  assert not source_checks.comparisons_naming(strategy.STRATEGIES, owner="distribute/strategy.py")
  from absl import flags  # pylint: disable=g-import-not-at-top

  from trainer import flags as trainer_flags  # pylint: disable=g-import-not-at-top

  values = flags.FlagValues()
  trainer_flags.define_flags(values)
  assert values["strategy"].parser.enum_values == ["auto", *strategy.STRATEGIES]
