"""Logs Vertex reads right: on Vertex (CLOUD_ML_JOB_ID, no terminal) every Python record is one JSON line with
severity, message and the replica; elsewhere absl's text lines. Lines are parsed back as Cloud Logging would."""

import io
import json
import re

import pytest

import procs
from trainer.core import logs

# The quick tier (scripts/test.sh --quick): no test here trains for long or waits on peers.
pytestmark = pytest.mark.quick

# Lines TensorFlow's C++ runtime writes itself (not Python records): absl-C++ prefixes and their continuations.
_RUNTIME_LINE = re.compile(r"^([IWEF]\d{4} |WARNING: All log messages before absl::InitializeLog|To enable the "
                           r"following instructions)")
TF_CONFIG = json.dumps({"cluster": {"chief": ["127.0.0.1:1"]}, "task": {"type": "chief", "index": 0}})


def _records(stderr):
  """Every stderr line as Cloud Logging files it: (severity, message) for JSON, None for a runtime line."""
  parsed = []
  for line in stderr.splitlines():
    if line.startswith("{"):
      entry = json.loads(line)
      parsed.append(entry)
    else:
      assert _RUNTIME_LINE.match(line), f"a line that is neither JSON nor TensorFlow's runtime: {line!r}"
  return parsed


@pytest.mark.smoke
def test_on_vertex_every_record_is_a_json_line_with_severity_and_replica(churn_data, tmp_path):
  result = procs.run_trainer([f"--train_data={churn_data}/train/*.tfrecord", f"--output_dir={tmp_path}/out",
                              "--train_steps=20", "--log_every_steps=10", "--eval_steps=0"],
                             env={"CLOUD_ML_JOB_ID": "4242", "TF_CONFIG": TF_CONFIG})
  assert result.returncode == 0, result.stderr[-3000:]
  records = _records(result.stderr)
  assert {(r["task_type"], r["task_index"]) for r in records} == {("chief", 0)}
  assert all(r["severity"] in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL") for r in records)
  messages = {r["severity"]: [] for r in records}
  for r in records:
    messages[r["severity"]].append(r["message"])
  assert any(m.startswith("Final metrics: ") for m in messages["INFO"])
  assert any(re.match(r"step 20/20 \(100%\)", m) for m in messages["INFO"])  # progress, not an error
  assert "ERROR" not in messages, messages.get("ERROR")
  assert all("file" in r["logging.googleapis.com/sourceLocation"] for r in records)


def test_a_user_error_on_vertex_is_one_error_record(churn_data, tmp_path):
  result = procs.run_trainer([f"--train_data={churn_data}/train/*.tfrecord", f"--output_dir={tmp_path}/out",
                              "--train_steps=-1"], env={"CLOUD_ML_JOB_ID": "4242", "TF_CONFIG": TF_CONFIG})
  assert result.returncode == 2
  errors = [r for r in _records(result.stderr) if r["severity"] == "ERROR"]
  assert [r["message"] for r in errors] == ["error: --train_steps must be a positive integer, got -1"]
  assert errors[0]["task_type"] == "chief"


def test_text_off_vertex_and_when_asked(churn_data, tmp_path):
  result = procs.run_trainer([f"--train_data={churn_data}/train/*.tfrecord", f"--output_dir={tmp_path}/out",
                              "--train_steps=-1", "--log_format=text"], env={"CLOUD_ML_JOB_ID": "4242"})
  assert result.returncode == 2
  assert result.stderr.strip().splitlines()[-1] == "error: --train_steps must be a positive integer, got -1"
  assert not [line for line in result.stderr.splitlines() if line.startswith("{")]


class _Terminal(io.StringIO):
  def isatty(self):
    return True


def test_auto_is_json_only_on_vertex_without_a_terminal():
  assert logs.resolve("auto", {"CLOUD_ML_JOB_ID": "1"}, io.StringIO()) == "json"
  assert logs.resolve("auto", {"CLOUD_ML_JOB_ID": "1"}, _Terminal()) == "text"  # a person is watching
  assert logs.resolve("auto", {}, io.StringIO()) == "text"
  assert logs.resolve("json", {}, _Terminal()) == "json"
  assert [logs.severity(n) for n in (10, 20, 30, 40, 50, 35)] == ["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL",
                                                                  "WARNING"]
  cluster_spec = json.dumps({"cluster": {"workerpool1": ["h:1"]}, "task": {"type": "workerpool1", "index": 3}})
  assert logs.replica_fields({"CLUSTER_SPEC": cluster_spec}) == {"task_type": "workerpool1", "task_index": 3}
  assert logs.replica_fields({}) == {}
