"""Cluster parsing: TF_CONFIG and Vertex CLUSTER_SPEC as plain strings, no os.environ."""

import json

import pytest

from trainer.core.errors import UserError
from trainer.distribute import cluster

# The quick tier (scripts/test.sh --quick): no test here trains for long or waits on peers.
pytestmark = pytest.mark.quick

ADDR = {"chief": ["c:1"], "worker": ["w:1", "w:2"], "ps": ["p:1"]}


def tf_config(cluster_dict, task_type, index=0, **extra):
  return json.dumps({"cluster": cluster_dict, "task": {"type": task_type, "index": index, **extra}})


def vertex_spec(pools, pool, index=0):
  return json.dumps({"cluster": pools, "environment": "cloud", "task": {"type": pool, "index": index},
                     "job": "{\"python_module\": \"trainer.task\"}", "open_ports": [2222]})


VERTEX_POOLS = {"workerpool0": ["c:1"], "workerpool1": ["w:1", "w:2"], "workerpool2": ["p:1"],
                "workerpool3": ["e:1"]}


@pytest.mark.parametrize("pool,index,task_type,is_chief", [
    ("workerpool0", 0, "chief", True),
    ("workerpool1", 0, "worker", False),
    ("workerpool1", 1, "worker", False),
    ("workerpool2", 0, "ps", False),
    ("workerpool3", 0, "evaluator", False),
])
def test_vertex_cluster_spec_each_pool(pool, index, task_type, is_chief):
  role = cluster.parse_cluster_spec(vertex_spec(VERTEX_POOLS, pool, index))
  assert (role.task_type, role.task_index, role.is_chief) == (task_type, index, is_chief)
  assert role.tf_cluster_dict() == {"chief": ["c:1"], "worker": ["w:1", "w:2"], "ps": ["p:1"]}
  assert role.num_workers == 3 and role.num_ps == 1
  assert role.source == "CLUSTER_SPEC"


@pytest.mark.parametrize("task_type,index,is_chief", [
    ("chief", 0, True), ("worker", 0, False), ("worker", 1, False), ("ps", 0, False)])
def test_tf_config_roles(task_type, index, is_chief):
  role = cluster.parse_tf_config(tf_config(ADDR, task_type, index))
  assert (role.task_type, role.task_index, role.is_chief) == (task_type, index, is_chief)
  assert role.num_workers == 3


def test_evaluator_is_not_in_the_cluster():
  role = cluster.parse_tf_config(tf_config({"chief": ["c:1"], "worker": ["w:1"]}, "evaluator", 0))
  assert role.is_evaluator and not role.is_chief
  assert "evaluator" not in role.tf_cluster_dict()


def test_legacy_master_is_the_chief():
  role = cluster.parse_tf_config(tf_config({"master": ["m:1"], "worker": ["w:1"]}, "master", 0))
  assert role.task_type == "chief" and role.is_chief
  assert role.tf_cluster_dict() == {"chief": ["m:1"], "worker": ["w:1"]}


def test_worker_only_cluster_makes_worker_zero_chief():
  workers = {"worker": ["w:3", "w:1"]}
  assert cluster.parse_tf_config(tf_config(workers, "worker", 0)).is_chief
  assert not cluster.parse_tf_config(tf_config(workers, "worker", 1)).is_chief


def test_no_cluster_is_a_local_chief():
  role = cluster.resolve_role(tf_config=None, cluster_spec=None)
  assert (role.task_type, role.task_index, role.is_chief, role.num_workers) == ("chief", 0, True, 1)
  assert role.source == "none" and not role.cluster


def test_single_replica_vertex_job_is_local():
  role = cluster.parse_cluster_spec(vertex_spec({"workerpool0": ["c:1"]}, "workerpool0"))
  assert role.is_chief and not role.is_multi_worker and not role.cluster


def test_tf_config_wins_over_cluster_spec():
  role = cluster.resolve_role(tf_config=tf_config(ADDR, "worker", 1),
                              cluster_spec=vertex_spec(VERTEX_POOLS, "workerpool0"))
  assert (role.task_type, role.task_index, role.source) == ("worker", 1, "TF_CONFIG")


def test_trial_is_kept():
  role = cluster.parse_tf_config(tf_config(ADDR, "chief", 0, trial="7"))
  assert role.trial == "7"


@pytest.mark.parametrize("text,message", [
    ("{not json", r"^TF_CONFIG is not valid JSON \(Expecting property name enclosed in double quotes at char 1\)"),
    ("[1, 2]", r"^TF_CONFIG must be a JSON object with 'cluster' and 'task', got '\[1, 2\]'$"),
    (tf_config(ADDR, "boss"), r"^TF_CONFIG: unknown task type 'boss'; expected one of chief, master, worker, ps, "
                              r"evaluator$"),
    (tf_config(ADDR, "worker", 2), r"^TF_CONFIG: task index 2 is out of range for 'worker' \(valid: 0\.\.1\)$"),
    (tf_config(ADDR, "worker", -1), r"^TF_CONFIG: task index must be a non-negative integer, got -1$"),
    (tf_config({"ps": ["p:1"]}, "ps"), r"^TF_CONFIG: the cluster has no chief and no worker \(task types: ps\); "),
    (tf_config({"chief": ["a:1", "b:1"]}, "chief"), r"^TF_CONFIG: a cluster has at most one chief, got 2"),
    (tf_config({"chief": ["c:1"], "worker": ["w:1"]}, "ps"), r"^TF_CONFIG: task type 'ps' is not in the cluster"),
])
def test_bad_tf_config(text, message):
  with pytest.raises(UserError, match=message):
    cluster.parse_tf_config(text)


def test_bad_cluster_spec():
  with pytest.raises(UserError, match=r"^CLUSTER_SPEC is not valid JSON"):
    cluster.parse_cluster_spec("{")
  with pytest.raises(UserError, match=r"^CLUSTER_SPEC: unknown worker pool 'workerpool9'; expected one of "
                                      r"workerpool0, workerpool1, workerpool2, workerpool3$"):
    cluster.parse_cluster_spec(vertex_spec({"workerpool9": ["x:1"]}, "workerpool9"))
  with pytest.raises(UserError, match=r"^CLUSTER_SPEC: task index 3 is out of range for 'worker'"):
    cluster.parse_cluster_spec(vertex_spec(VERTEX_POOLS, "workerpool1", 3))
