"""Who this process is in the job: parsed from TF_CONFIG or Vertex's CLUSTER_SPEC.

Pure functions over plain strings and dicts; nothing here reads `os.environ`. The result, `ClusterRole`, uses
TensorFlow's task types (chief, worker, ps, evaluator) whatever the source called them, so the strategy code
sees one vocabulary:

- Vertex AI's CLUSTER_SPEC names pools `workerpool0..3`: pool 0 is the chief, 1 the workers, 2 the parameter
  servers, 3 the evaluators.
- Legacy AI Platform's TF_CONFIG calls the chief `master`.
- A cluster of workers only (Kubeflow, hand-written) has no chief; worker 0 is the chief, as TF itself decides.
- The evaluator is never listed in TF_CONFIG's `cluster`; it is a side-car outside the training cluster.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Mapping

from trainer.core.errors import UserError

CHIEF = "chief"
WORKER = "worker"
PS = "ps"
EVALUATOR = "evaluator"

TASK_TYPES = (CHIEF, WORKER, PS, EVALUATOR)
_TYPE_ALIASES = {"master": CHIEF}
# Vertex worker pool -> TF_CONFIG task type, in pool order (workerPoolSpecs[i] is "workerpool<i>").
VERTEX_POOLS = {"workerpool0": CHIEF, "workerpool1": WORKER, "workerpool2": PS, "workerpool3": EVALUATOR}


@dataclasses.dataclass(frozen=True)
class ClusterRole:
  """This process's place in the job.

  Attributes:
    task_type: one of chief, worker, ps, evaluator.
    task_index: index within `task_type`.
    cluster: the training cluster, `{task_type: [host:port, ...]}` with keys among chief/worker/ps only
      (the shape `tf.train.ClusterSpec` takes). Empty when the job has no cluster.
    source: where the role came from: "TF_CONFIG", "CLUSTER_SPEC" or "none".
    trial: the hyperparameter-tuning trial id, if any.
  """

  task_type: str = CHIEF
  task_index: int = 0
  cluster: Mapping[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)
  source: str = "none"
  trial: str | None = None

  @property
  def num_workers(self) -> int:
    """Training processes: the chief plus the workers (1 when there is no cluster)."""
    if not self.cluster:
      return 1
    return len(self.cluster.get(CHIEF, ())) + len(self.cluster.get(WORKER, ()))

  @property
  def num_ps(self) -> int:
    return len(self.cluster.get(PS, ()))

  @property
  def is_chief(self) -> bool:
    """True for the one process that writes the job's outputs."""
    if self.task_type == CHIEF:
      return True
    # With no chief listed, worker 0 is the chief (TensorFlow's own rule).
    return self.task_type == WORKER and self.task_index == 0 and not self.cluster.get(CHIEF)

  @property
  def is_evaluator(self) -> bool:
    return self.task_type == EVALUATOR

  @property
  def is_multi_worker(self) -> bool:
    return self.num_workers > 1

  def tf_cluster_dict(self) -> dict[str, list[str]]:
    """The cluster as `tf.train.ClusterSpec` takes it."""
    return {task_type: list(addresses) for task_type, addresses in self.cluster.items()}


def parse_tf_config(text: str, *, variable: str = "TF_CONFIG") -> ClusterRole:
  """Parses a TF_CONFIG JSON string (TensorFlow, Vertex AI, legacy AI Platform, Kubeflow TFJob)."""
  cluster, task = _cluster_and_task(text, variable)
  normalized = {}
  for raw_type, addresses in cluster.items():
    task_type = _normalize_type(raw_type, variable, accepted=("chief", "master", "worker", "ps", "evaluator"))
    normalized[task_type] = _address_list(addresses, variable, raw_type)
  if not task and not normalized:
    return ClusterRole(source=variable)
  task_type = _normalize_type(task.get("type"), variable, accepted=("chief", "master", "worker", "ps", "evaluator"))
  task_index = _task_index(task.get("index", 0), variable)
  trial = task.get("trial")
  return _make_role(normalized, task_type, task_index, variable, None if trial in (None, "") else str(trial))


def parse_cluster_spec(text: str, *, variable: str = "CLUSTER_SPEC") -> ClusterRole:
  """Parses Vertex AI's CLUSTER_SPEC (pools `workerpool0..3`)."""
  cluster, task = _cluster_and_task(text, variable)
  normalized = {}
  for pool, addresses in cluster.items():
    if pool not in VERTEX_POOLS:
      raise UserError(f"{variable}: unknown worker pool {pool!r}; expected one of {', '.join(VERTEX_POOLS)}")
    normalized[VERTEX_POOLS[pool]] = _address_list(addresses, variable, pool)
  pool = task.get("type")
  if pool not in VERTEX_POOLS:
    raise UserError(f"{variable}: unknown task type {pool!r}; expected one of {', '.join(VERTEX_POOLS)}")
  trial = task.get("trial")
  return _make_role(
      normalized, VERTEX_POOLS[pool], _task_index(task.get("index", 0), variable), variable,
      None if trial in (None, "") else str(trial))


def resolve_role(*, tf_config: str | None, cluster_spec: str | None) -> ClusterRole:
  """The role from the environment's two descriptions; TF_CONFIG wins, as TensorFlow itself reads it."""
  if tf_config and tf_config.strip():
    return parse_tf_config(tf_config)
  if cluster_spec and cluster_spec.strip():
    return parse_cluster_spec(cluster_spec)
  return ClusterRole()


def _make_role(cluster: dict[str, tuple[str, ...]], task_type: str, task_index: int, variable: str,
               trial: str | None) -> ClusterRole:
  # The evaluator runs beside the training cluster, never in it (TF_CONFIG never lists it; CLUSTER_SPEC does).
  evaluators = cluster.pop(EVALUATOR, ())
  if len(cluster.get(CHIEF, ())) > 1:
    raise UserError(f"{variable}: a cluster has at most one chief, got {len(cluster[CHIEF])}: {list(cluster[CHIEF])}")
  if cluster and not cluster.get(CHIEF) and not cluster.get(WORKER):
    raise UserError(f"{variable}: the cluster has no chief and no worker (task types: {', '.join(cluster)}); "
                    "a training cluster needs a chief or at least one worker")
  if task_type == EVALUATOR:
    if evaluators and task_index >= len(evaluators):
      raise UserError(f"{variable}: task index {task_index} is out of range for evaluator "
                      f"({len(evaluators)} listed)")
  elif cluster:
    size = len(cluster.get(task_type, ()))
    if size == 0:
      raise UserError(f"{variable}: task type {task_type!r} is not in the cluster "
                      f"(it lists {', '.join(cluster) or 'nothing'})")
    if task_index >= size:
      raise UserError(f"{variable}: task index {task_index} is out of range for {task_type!r} "
                      f"(valid: 0..{size - 1})")
  elif task_type != CHIEF or task_index != 0:
    raise UserError(f"{variable}: task {task_type}:{task_index} given but the cluster is empty; "
                    "list the cluster or drop the task")
  if cluster and len(cluster.get(CHIEF, ())) + len(cluster.get(WORKER, ())) == 1 and not cluster.get(PS):
    # A one-process "cluster" (Vertex sets one for a single replica) is a local job.
    return ClusterRole(task_type=task_type, task_index=task_index, cluster={}, source=variable, trial=trial)
  return ClusterRole(task_type=task_type, task_index=task_index, cluster=cluster, source=variable, trial=trial)


def _cluster_and_task(text: str, variable: str) -> tuple[dict[str, Any], dict[str, Any]]:
  """The 'cluster' and 'task' objects of a TF_CONFIG-shaped JSON string."""
  try:
    value = json.loads(text)
  except json.JSONDecodeError as e:
    raise UserError(f"{variable} is not valid JSON ({e.msg} at char {e.pos}): {text!r}") from None
  if not isinstance(value, dict):
    raise UserError(f"{variable} must be a JSON object with 'cluster' and 'task', got {text!r}")
  cluster = value.get("cluster") or {}
  task = value.get("task") or {}
  if not isinstance(cluster, dict) or not isinstance(task, dict):
    raise UserError(f"{variable}: 'cluster' and 'task' must be JSON objects, got {text!r}")
  return cluster, task


def _normalize_type(raw: Any, variable: str, *, accepted: tuple[str, ...]) -> str:
  if not isinstance(raw, str) or raw.lower() not in accepted:
    raise UserError(f"{variable}: unknown task type {raw!r}; expected one of {', '.join(accepted)}")
  raw = raw.lower()
  return _TYPE_ALIASES.get(raw, raw)


def _task_index(raw: Any, variable: str) -> int:
  try:
    index = int(raw)
  except (TypeError, ValueError):
    raise UserError(f"{variable}: task index must be a non-negative integer, got {raw!r}") from None
  if index < 0 or isinstance(raw, bool):
    raise UserError(f"{variable}: task index must be a non-negative integer, got {raw!r}")
  return index


def _address_list(raw: Any, variable: str, name: str) -> tuple[str, ...]:
  if not isinstance(raw, list) or not all(isinstance(a, str) and a for a in raw):
    raise UserError(f"{variable}: cluster entry {name!r} must be a list of 'host:port' strings, got {raw!r}")
  for address in raw:
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
      raise UserError(f"{variable}: address {address!r} of cluster entry {name!r} is not 'host:port' with a "
                      "port in 1..65535")
  return tuple(raw)


def without_parameter_servers(role: ClusterRole) -> ClusterRole:
  """The role with pool 2 removed: with a Reduction Server there, pool 2 is not a parameter-server pool."""
  if role.task_type == PS:
    raise UserError(f"--reduction_server: this process is task {role.task_type}:{role.task_index} of pool 2, "
                    "which runs the Reduction Server image, not the trainer")
  cluster = {k: v for k, v in role.cluster.items() if k != PS}
  if len(cluster.get(CHIEF, ())) + len(cluster.get(WORKER, ())) <= 1:
    cluster = {}
  return dataclasses.replace(role, cluster=cluster)
