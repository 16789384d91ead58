"""Cloud Storage through the emulator: TensorFlow's native gs:// (via the TLS proxy) and
google-cloud-storage, training and exporting on gs://, resume, injected faults, and bad URIs."""

import json
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import tensorflow as tf

import procs
import serving_checks
from scripts import check_model
from scripts import emulator as emulator_lib
from scripts import stage_data


def test_gfile_read_write_glob_stat(gcs):
  path = "gs://test-bucket/gfile/hello.txt"
  with tf.io.gfile.GFile(path, "w") as f:
    f.write("hello " * 1000)
  assert tf.io.gfile.exists(path)
  assert tf.io.gfile.stat(path).length == 6000
  assert tf.io.gfile.glob("gs://test-bucket/gfile/*.txt") == [path]
  with tf.io.gfile.GFile(path) as f:
    assert f.read() == "hello " * 1000
  from google.cloud import storage  # pylint: disable=g-import-not-at-top
  names = [b.name for b in storage.Client(project="p").list_blobs("test-bucket", prefix="gfile/")]
  assert names == ["gfile/hello.txt"]  # the same object seen by the Python client
  assert not tf.io.gfile.exists("gs://test-bucket/gfile/absent.txt")


def _proxy_requests(emulator) -> int:
  """Requests the emulator's TLS proxy has forwarded so far (it reports them on SIGUSR1)."""
  log = os.path.join(emulator.directory, "gcs-proxy.log")
  with open(log) as f:
    lines_before = len(f.read().splitlines())
  os.kill(emulator.pids[0], signal.SIGUSR1)
  deadline = time.monotonic() + 10
  while time.monotonic() < deadline:
    with open(log) as f:
      lines = f.read().splitlines()
    if len(lines) > lines_before:
      return json.loads(lines[-1])["forwarded"]
    time.sleep(0.05)
  raise AssertionError("the gcs proxy did not report its request count")


def test_trainer_sets_its_gcs_read_block_before_tensorflow_loads(gcs):
  """TF's gs:// reader buffers GCS_READ_CACHE_BLOCK_SIZE_MB per open file (64 MiB by default) and reads the
  variable only when TensorFlow is imported: the trainer must set its 8 MiB before anything imports TF."""
  gcs.storage_client().bucket("test-bucket").blob("blocks/20mib.bin").upload_from_string(os.urandom(20 << 20))
  read = ("import os, sys\n"
          "from trainer.core import storage\n"
          "if sys.argv[1] == 'trainer': storage.configure_gcs(os.environ)\n"
          "import tensorflow as tf\n"
          "with tf.io.gfile.GFile('gs://test-bucket/blocks/20mib.bin', 'rb') as f: assert len(f.read()) == 20 << 20\n")
  env = procs.trainer_env(gcs.env)
  env.pop("GCS_READ_CACHE_BLOCK_SIZE_MB", None)
  requests = {}
  for setting in ("trainer", "tensorflow-default"):
    before = _proxy_requests(gcs)
    result = subprocess.run([sys.executable, "-c", read, setting], env=env, cwd=procs.REPO, capture_output=True,
                            text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr[-2000:]
    requests[setting] = _proxy_requests(gcs) - before
  assert requests["trainer"] - requests["tensorflow-default"] == 2, requests  # 3 blocks of 8 MiB, not 1 of 64
  # The entry point loads no TensorFlow before main() runs, so its configure_gcs call comes first.
  code = ("import sys, trainer.task, trainer.runner, trainer.flags\n"
          "print(sorted(m for m in sys.modules if m.split('.')[0] in ('tensorflow', 'keras', 'tf_keras')))")
  imported = subprocess.run([sys.executable, "-c", code], env=env, cwd=procs.REPO, capture_output=True, text=True,
                            timeout=60, check=True).stdout.strip()
  assert imported == "[]"
  from trainer.core import storage  # pylint: disable=g-import-not-at-top
  unset, chosen = {}, {"GCS_READ_CACHE_BLOCK_SIZE_MB": "2", "GCS_RETRY_CONFIG_MAX_RETRIES": "10"}
  storage.configure_gcs(unset)
  storage.configure_gcs(chosen)
  assert unset == {"GCS_READ_CACHE_BLOCK_SIZE_MB": "8", "GCS_RETRY_CONFIG_MAX_RETRIES": "6",
                   "GCS_RETRY_CONFIG_MAX_DELAY_TIME_US": "16000000", "GCS_REQUEST_CONNECTION_TIMEOUT_SECS": "20"}
  # A user's own setting wins.
  assert chosen["GCS_READ_CACHE_BLOCK_SIZE_MB"] == "2" and chosen["GCS_RETRY_CONFIG_MAX_RETRIES"] == "10"


def _gcs_args(data, out, *extra):
  return [f"--train_data={data}/train/*.tfrecord", f"--eval_data={data}/eval/*.tfrecord", f"--output_dir={out}",
          "--global_batch_size=64", *extra]


def _metrics(model_dir):
  with tf.io.gfile.GFile(f"{model_dir}/eval_metrics.json") as f:
    return json.load(f)


def test_train_from_gcs_and_serve_the_export_from_gcs(gcs, gcs_churn):
  out = "gs://test-bucket/runs/single"
  result = procs.run_trainer_here(_gcs_args(gcs_churn, out, "--train_steps=300"), env=gcs.env)
  assert result.returncode == 0, result.stderr[-3000:]
  metrics = _metrics(f"{out}/model")
  assert metrics["final_step"] == 300 and metrics["eval_accuracy"] > 0.85
  assert tf.io.gfile.glob(f"{out}/logs/train/events.out.tfevents.*")
  assert tf.io.gfile.exists(f"{out}/checkpoints/checkpoint")
  served = check_model.predict_eval(f"{out}/model", f"{gcs_churn}/eval/*.tfrecord")
  assert served["examples"] == 1000
  assert abs(served["accuracy"] - metrics["eval_accuracy"]) < 0.03


def test_export_reloaded_from_gcs_predicts_like_the_model(gcs, churn_data):
  from trainer.core import config as config_lib  # pylint: disable=g-import-not-at-top
  from trainer.data import features  # pylint: disable=g-import-not-at-top
  from trainer.data import schema as schema_lib  # pylint: disable=g-import-not-at-top
  from trainer.modeling import export  # pylint: disable=g-import-not-at-top
  from trainer.modeling import models  # pylint: disable=g-import-not-at-top
  schema = schema_lib.load_schema(f"{churn_data}/train/schema.json")
  model = models.build_tabular(schema, config_lib.ModelConfig(hidden_units=(8,)))
  raw = {"tenure_months": tf.constant([1.0, 40.0, 7.5]), "monthly_charges": tf.constant([20.0, 90.0, 70.0]),
         "support_calls": tf.constant([0.0, 3.0, 1.0]), "plan": tf.constant(["pro", "basic", "gold"]),
         "region": tf.constant(["east", "west", "north"])}
  expected = tf.nn.softmax(model(features.FeatureEncoder(schema).encode(raw))).numpy()
  export.export_saved_model(model, schema, "gs://test-bucket/exports/reload")
  served = tf.saved_model.load("gs://test-bucket/exports/reload").signatures["serving_default"](**raw)
  np.testing.assert_allclose(served["probabilities"].numpy(), expected, rtol=1e-6)


def test_multi_worker_reads_and_exports_gcs(gcs, gcs_churn, churn_data, tmp_path):
  """A two-process MultiWorkerMirrored job on the bucket: both workers read gs://, the chief alone exports there.
  Its model is a tutorial-style subclassed Keras model (a plug-in taking a dict of features), so that this one
  real run is also the subclassed model's multi-process one: it learns, and its export serves."""
  out = "gs://test-bucket/runs/mwms"
  chief, worker = procs.addresses(2)
  cluster = {"chief": [chief], "worker": [worker]}
  args = _gcs_args(gcs_churn, out, "--train_steps=120", "--checkpoint_every_steps=60",
                   "--model=tutorial_models:subclassed_dict_softmax")
  plugin_path = {"PYTHONPATH": os.path.dirname(__file__)}  # tests/tutorial_models.py
  with procs.cluster(str(tmp_path)) as c:
    for name in ("chief", "worker"):
      c.start(name, args, {**gcs.env, **plugin_path, "TF_CONFIG": procs.tf_config(cluster, name, 0)})
    codes = c.wait(["chief", "worker"], 300)
    assert codes == {"chief": 0, "worker": 0}, c.log("chief")[-2000:] + c.log("worker")[-2000:]
    digests = [re.findall(r'"weights_sha256": "(\w+)"', c.log(n))[-1] for n in ("chief", "worker")]
  assert digests[0] == digests[1]
  metrics = _metrics(f"{out}/model")
  assert metrics["strategy"] == "MultiWorkerMirroredStrategy" and metrics["num_replicas"] == 2
  assert metrics["final_step"] == 120 and metrics["eval_accuracy"] > 0.6, metrics
  assert tf.io.gfile.glob(f"{out}/**/saved_model.pb") == [f"{out}/model/saved_model.pb"]
  local = serving_checks.copy_tree(f"{out}/model", tmp_path / "model")  # the loaders' check reads from disk
  serving_checks.assert_loaders_agree(local, f"{churn_data}/eval/*.tfrecord")


def test_gcs_checkpoints_resume_a_killed_run(gcs, gcs_churn):
  out = "gs://test-bucket/runs/resume"
  args = _gcs_args(gcs_churn, out, "--train_steps=1500", "--checkpoint_every_steps=500", "--steps_per_loop=50",
                   "--global_batch_size=32", "--eval_steps=5")
  proc = subprocess.Popen(procs.trainer_cmd(args), env=procs.trainer_env(gcs.env), cwd=procs.REPO,
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
  try:
    deadline = time.monotonic() + 180
    while not tf.io.gfile.exists(f"{out}/checkpoints/checkpoint"):
      assert proc.poll() is None, "trainer ended before its first checkpoint"
      assert time.monotonic() < deadline
      time.sleep(0.1)
  finally:
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
  assert not tf.io.gfile.exists(f"{out}/model/saved_model.pb")
  result = procs.run_trainer(args, env=gcs.env)
  assert result.returncode == 0, result.stderr[-3000:]
  metrics = _metrics(f"{out}/model")
  assert metrics["resumed_from_step"] >= 500 and metrics["final_step"] == 1500


def test_injected_transient_failures_do_not_change_the_result(gcs, gcs_churn, churn_data, tmp_path):
  flaky_dir = tmp_path / "flaky"
  args = ["--train_steps=100", "--checkpoint_every_steps=50", "--deterministic_input", "--shuffle_buffer=0",
          "--eval_steps=5"]
  clean = procs.run_trainer(_gcs_args(gcs_churn, "gs://test-bucket/runs/clean", *args), env=gcs.env)
  assert clean.returncode == 0, clean.stderr[-3000:]
  flaky = emulator_lib.start(buckets=("flaky-bucket",), fail_rate=0.1, seed=3, directory=str(flaky_dir))
  try:
    for split in ("train", "eval"):  # staged with google-cloud-storage straight to the emulator, no faults
      stage_data.upload_tree(f"{churn_data}/{split}", f"gs://flaky-bucket/churn/{split}",
                             client=flaky.storage_client())
    result = procs.run_trainer(_gcs_args("gs://flaky-bucket/churn", "gs://flaky-bucket/runs/flaky", *args),
                               env=flaky.env)
  finally:
    flaky.stop()
  assert result.returncode == 0, result.stderr[-3000:]
  with open(flaky_dir / "gcs-proxy.log") as f:
    stats = json.loads(f.read().strip().splitlines()[-1])
  assert stats["injected"] >= 5, stats  # failures really happened, and were retried
  digest = lambda text: re.findall(r'"weights_sha256": "(\w+)"', text)[-1]  # noqa: E731
  assert digest(result.stderr) == digest(clean.stderr)


@pytest.mark.parametrize("pattern,message", [
    ("gs://no-such-bucket/data/*.tfrecord", r"^error: --train_data: no files match 'gs://no-such-bucket/data/"),
    ("gs://test-bucket/nothing-here/*.tfrecord", r"^error: --train_data: no files match 'gs://test-bucket/nothing"),
])
def test_missing_bucket_or_object_names_the_uri(gcs, pattern, message, capsys):
  code = procs.run_trainer_in_process([f"--train_data={pattern}", "--output_dir=gs://test-bucket/runs/bad"],
                                      env=gcs.env)
  err = capsys.readouterr().err
  assert code == 2 and re.search(message, err, re.M), err[-2000:]


def test_missing_schema_object_names_the_uri(gcs, gcs_churn, capsys):
  code = procs.run_trainer_in_process([f"--train_data={gcs_churn}/train/*.tfrecord",
                                       "--schema=gs://test-bucket/nope.json", "--output_dir=gs://test-bucket/runs/bad"],
                                      env=gcs.env)
  assert code == 2 and "error: --schema: file gs://test-bucket/nope.json not found" in capsys.readouterr().err


def test_emulator_down_fails_within_bounded_time(tmp_path):
  emulator = emulator_lib.start(buckets=("gone",), directory=str(tmp_path / "gone"))
  env = emulator.env
  emulator.stop()
  started = time.monotonic()
  result = procs.run_trainer(["--train_data=gs://gone/data/*.tfrecord", "--output_dir=gs://gone/out"], env=env,
                             timeout=180)
  elapsed = time.monotonic() - started
  assert result.returncode == 2, result.stderr[-2000:]
  assert re.search(r"^error: --train_data: cannot list gs://gone/data/\*\.tfrecord: ", result.stderr, re.M), \
      result.stderr[-2000:]
  assert elapsed < 120


@pytest.mark.parametrize("fail_rate", [0.05, 0.2])
def test_uploads_survive_injected_faults_whole(tmp_path, fail_rate):
  """TensorFlow's gs:// writer through the faulty proxy: every object arrives whole. fake-gcs-server alone
  answered TF's resumable-upload status query with 200 and kept a 0-byte object; the proxy answers 308 as real
  Cloud Storage does. In a subprocess: this process's TensorFlow already points at the session emulator."""
  import hashlib  # pylint: disable=g-import-not-at-top
  flaky = emulator_lib.start(buckets=("faulty",), fail_rate=fail_rate, seed=11, directory=str(tmp_path / "gcs"))
  try:
    script = ("import hashlib, os, tensorflow as tf\n"
              "for i in range(40):\n"
              "  data = os.urandom(50_000 + 997 * i)\n"
              "  with tf.io.gfile.GFile(f'gs://faulty/objects/{i}.bin', 'wb') as f:\n"
              "    f.write(data)\n"
              "  print(i, hashlib.sha256(data).hexdigest())\n")
    result = subprocess.run([sys.executable, "-c", script], env=procs.trainer_env(flaky.env), capture_output=True,
                            text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    written = dict(line.split() for line in result.stdout.splitlines())
    bucket = flaky.storage_client().bucket("faulty")
    stored = {blob.name.split("/")[-1].split(".")[0]: hashlib.sha256(blob.download_as_bytes()).hexdigest()
              for blob in bucket.list_blobs(prefix="objects/")}
  finally:
    flaky.stop()
  assert stored == written  # 40 objects, each byte for byte
  with open(tmp_path / "gcs" / "gcs-proxy.log") as f:
    stats = json.loads(f.read().strip().splitlines()[-1])
  assert stats["injected"] >= 2, stats  # faults really happened


def test_a_storage_outage_mid_run_ends_in_one_line_naming_the_bucket(churn_data, tmp_path):
  """Cloud Storage goes away while the run checkpoints to it: the next save fails after the trainer's bounded
  retries (the emulator's short first delay keeps this test quick) with one line naming the bucket, exit 1."""
  outage = emulator_lib.start(buckets=("outage-bucket",), directory=str(tmp_path / "gcs"))
  log_path = tmp_path / "trainer.log"
  try:
    with open(log_path, "w") as log:
      proc = subprocess.Popen(procs.trainer_cmd([
          f"--train_data={churn_data}/train/*.tfrecord", "--output_dir=gs://outage-bucket/run",
          "--global_batch_size=64", "--train_steps=1000000", "--checkpoint_every_steps=100", "--log_every_steps=50"]),
          env=procs.trainer_env(outage.env), cwd=procs.REPO, stdout=log, stderr=subprocess.STDOUT,
          start_new_session=True)
    deadline = time.monotonic() + 180
    while "Saved checkpoint gs://outage-bucket/run/checkpoints/ckpt-100" not in log_path.read_text():
      assert proc.poll() is None and time.monotonic() < deadline, log_path.read_text()[-3000:]
      time.sleep(0.2)
    outage.stop()
    stopped = time.monotonic()
    code = proc.wait(timeout=150)
    took = time.monotonic() - stopped
  finally:
    if proc.poll() is None:
      os.killpg(proc.pid, 9)
      proc.wait()
    outage.stop()
  text = log_path.read_text()
  errors = [line for line in text.splitlines() if line.startswith("error:")]
  assert code == 1 and len(errors) == 1, text[-3000:]
  assert errors[0].startswith("error: gs://outage-bucket is unreachable (")
  assert "All 6 retry attempts failed" in errors[0]  # the trainer's bound, not TensorFlow's 10
  assert "Traceback" not in text
  assert took < 120
