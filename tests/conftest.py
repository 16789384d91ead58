"""Shared fixtures: small demo datasets made once per session."""

from __future__ import annotations

import os

import pytest

# The repo root and tests/ are on the import path through pytest.ini's `pythonpath`.
from scripts import loopback  # pylint: disable=wrong-import-position

for _name, _value in {**loopback.LOOPBACK_ENV, "TF_CPP_MIN_LOG_LEVEL": "2"}.items():
  os.environ.setdefault(_name, _value)

# In-process runs read gs:// as a trainer process does: TensorFlow takes its gs:// read-ahead block and retry bound
# from the environment once, when it loads, so they are set here, before anything imports it (`task.py` does the
# same in its own process).
from trainer.core import storage as _storage  # pylint: disable=wrong-import-position

_storage.configure_gcs(os.environ)

# In-process loop tests run MirroredStrategy over 2 logical CPUs. The split must happen before any TensorFlow op
# in this process, so it happens here, with the trainer's own function; the default strategy still uses one.
IN_PROCESS_CPU_DEVICES = 2
from trainer.distribute import strategy as _strategy_lib  # pylint: disable=wrong-import-position

_strategy_lib.configure_devices(IN_PROCESS_CPU_DEVICES)


@pytest.fixture(autouse=True)
def _collective_keys_of_its_own():
  """Every test's in-process MirroredStrategy numbers its collectives from a base of its own: TensorFlow caches a
  collective by (group key, instance key) for the process's life, so a text model's 1.28M-value all-reduce in one
  test and a churn model's 2,978 in the next, both at instance 100, failed the second ("Shape mismatch in the
  collective instance 100") whenever xdist put them in the same process."""
  import procs  # pylint: disable=g-import-not-at-top

  with procs.fresh_collective_keys():
    yield


@pytest.fixture(scope="session", autouse=True)
def _temporary_files_under_pytests_own_dir(tmp_path_factory):
  """Temporary files of this test process and of every process it starts (TensorFlow's autograph modules, a
  killed worker's checkpoint scratch, a local job's default dir, pip's builds) go under pytest's base temp dir,
  which pytest prunes to its last three runs, instead of piling up in /tmp."""
  import tempfile  # pylint: disable=g-import-not-at-top

  directory = str(tmp_path_factory.mktemp("tmp"))
  saved = os.environ.get("TMPDIR"), tempfile.tempdir
  os.environ["TMPDIR"] = tempfile.tempdir = directory
  yield
  if saved[0] is None:
    os.environ.pop("TMPDIR", None)
  else:
    os.environ["TMPDIR"] = saved[0]
  tempfile.tempdir = saved[1]


def pytest_collection_modifyitems(items):
  """Tests marked `long` run first: with two test processes (scripts/test.sh), a test of minutes started last
  would run alone at the end while the other process idles."""
  items.sort(key=lambda item: item.get_closest_marker("long") is None)  # stable: file order otherwise


@pytest.fixture(scope="session")
def churn_data(tmp_path_factory) -> str:
  """Small churn dataset: train/ (4 shards) and eval/ (1 shard), TFRecord and CSV."""
  from scripts import demo_data  # pylint: disable=g-import-not-at-top

  directory = str(tmp_path_factory.mktemp("churn"))
  demo_data.make(directory, num_train=4000, num_eval=1000, num_shards=4)
  return directory


@pytest.fixture(scope="session")
def shapes_data(tmp_path_factory) -> str:
  from scripts import demo_data  # pylint: disable=g-import-not-at-top

  directory = str(tmp_path_factory.mktemp("shapes"))
  demo_data.make(directory, dataset="shapes", num_train=1024, num_eval=256, num_shards=4)
  return directory


@pytest.fixture(scope="session")
def gcs(tmp_path_factory):
  """Emulated Cloud Storage for the whole session (fake-gcs-server + TLS proxy), torn down at the end.

  Its environment is also set in this process, so in-process TensorFlow and google-cloud-storage reach it.
  """
  from scripts import emulator as emulator_lib  # pylint: disable=g-import-not-at-top

  emulator = emulator_lib.start(buckets=("test-bucket",), directory=str(tmp_path_factory.mktemp("gcs")))
  saved = {k: os.environ.get(k) for k in emulator.env}
  os.environ.update(emulator.env)
  try:
    yield emulator
  finally:
    emulator.stop()
    for key, value in saved.items():
      if value is None:
        os.environ.pop(key, None)
      else:
        os.environ[key] = value


@pytest.fixture(scope="session")
def gcs_churn(gcs, churn_data) -> str:
  """The churn dataset staged at gs://test-bucket/churn (TFRecord shards + schema.json)."""
  from scripts import stage_data  # pylint: disable=g-import-not-at-top

  for split in ("train", "eval"):
    stage_data.upload_tree(os.path.join(churn_data, split), f"gs://test-bucket/churn/{split}")
  return "gs://test-bucket/churn"
