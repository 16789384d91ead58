"""Publishing an export: a failed export leaves the previous good one untouched, a re-export replaces it whole
and removes the stale metrics file first, and no staging dir is left behind. In-process, local and gs://."""

import json
import os

import pytest
import tensorflow as tf

from trainer.core import config as config_lib
from trainer.core.errors import UserError
from trainer.data import schema as schema_lib
from trainer.modeling import export
from trainer.modeling import models

# The quick tier (scripts/test.sh --quick): no test here trains for long or waits on peers.
pytestmark = pytest.mark.quick

MARKER = "eval_metrics.json"


def _model(churn_data, units):
  schema = schema_lib.load_schema(f"{churn_data}/train/schema.json")
  return models.build_tabular(schema, config_lib.ModelConfig(hidden_units=(units,))), schema


def _listing(directory):
  return sorted(tf.io.gfile.listdir(directory)) if tf.io.gfile.exists(directory) else []


def _siblings(directory):
  parent, name = directory.rstrip("/").rsplit("/", 1)
  return sorted(n.rstrip("/") for n in tf.io.gfile.listdir(parent) if n.rstrip("/").startswith(name))


@pytest.mark.parametrize("where", ["local", "gs"])
def test_failed_export_keeps_the_previous_and_a_reexport_replaces_it(churn_data, tmp_path, where, request,
                                                                       monkeypatch):
  directory = str(tmp_path / "model") if where == "local" else "gs://test-bucket/exports/publish"
  if where == "gs":
    request.getfixturevalue("gcs")
  first, schema = _model(churn_data, 4)
  assert export.export_for_role(first, schema, directory, is_chief=True, complete_marker=MARKER) == directory
  with tf.io.gfile.GFile(f"{directory}/{MARKER}", "w") as f:
    f.write(json.dumps({"final_step": 1}))
  before = _listing(directory)
  assert "saved_model.pb" in before and MARKER in before

  second, _ = _model(churn_data, 8)

  def broken_save(*args, **kwargs):
    raise OSError("disk full (injected)")

  with monkeypatch.context() as patch:
    patch.setattr(tf.saved_model, "save", broken_save)
    with pytest.raises(OSError, match="injected"):
      export.export_for_role(second, schema, directory, is_chief=True, complete_marker=MARKER)
  assert _listing(directory) == before  # the previous complete export and its metrics, untouched
  assert _siblings(directory) == ["model" if where == "local" else "publish"]  # no staging dir left
  loaded = tf.saved_model.load(directory).signatures["serving_default"]
  assert loaded.structured_outputs  # still serves

  export.export_for_role(second, schema, directory, is_chief=True, complete_marker=MARKER)
  assert MARKER not in _listing(directory)  # the stale metrics are gone until the runner writes new ones
  assert _siblings(directory) == ["model" if where == "local" else "publish"]
  kernel_shapes = {tuple(v.shape) for v in tf.saved_model.load(directory).variables}
  assert (8, 2) in kernel_shapes and (4, 2) not in kernel_shapes  # the 8-unit model's output layer, not the 4's
  if where == "local":
    assert not os.path.exists(f"{directory}/{MARKER}")


@pytest.mark.parametrize("where", ["local", "gs"])
def test_an_interrupted_exports_staging_dir_is_removed_by_the_next_export(churn_data, tmp_path, where, request):
  """A chief killed inside an export leaves `model.staging-XXXX/` (a half, or a whole second, SavedModel) beside
  the model: the next export (the restart's) removes it before staging its own."""
  directory = str(tmp_path / "model") if where == "local" else "gs://test-bucket/exports/debris"
  if where == "gs":
    request.getfixturevalue("gcs")
  model, schema = _model(churn_data, 4)
  stale = f"{directory}.staging-0badf00d"
  export.export_saved_model(model, schema, stale)  # what a kill after staging, before publishing, leaves
  tf.io.gfile.makedirs(f"{directory}.staging-1badf00d/variables")
  with tf.io.gfile.GFile(f"{directory}.staging-1badf00d/variables/variables.index", "w") as f:
    f.write("half")  # and one killed mid-save
  assert len(_siblings(directory)) == 2
  export.export_for_role(model, schema, directory, is_chief=True, complete_marker=MARKER)
  assert _siblings(directory) == ["model" if where == "local" else "debris"]
  assert "saved_model.pb" in _listing(directory)


def test_an_export_interrupted_while_publishing_is_still_its_runs(churn_data, tmp_path, monkeypatch):
  """The run record (whose checkpoint dir says whose export the model dir holds) is published before anything
  else is replaced: a chief killed anywhere in the publishing leaves a model dir its restart may export into
  again, while another run is still refused (`check_model_dir`)."""
  directory = str(tmp_path / "model")
  model, schema = _model(churn_data, 4)
  record = {"config": {"output": {"checkpoint_dir": str(tmp_path / "checkpoints")}}}
  copies = []
  real_copy = tf.io.gfile.copy

  def killed_after_the_first_copy(source, target, overwrite=False):
    if copies:
      raise KeyboardInterrupt("killed (injected)")
    copies.append(target)
    real_copy(source, target, overwrite=overwrite)

  with monkeypatch.context() as patch:
    patch.setattr(tf.io.gfile, "copy", killed_after_the_first_copy)
    with pytest.raises(KeyboardInterrupt):
      export.export_for_role(model, schema, directory, is_chief=True, complete_marker=MARKER,
                             side_files={export.RUN_RECORD_FILE: record}, first=(export.RUN_RECORD_FILE,))
  assert copies == [f"{directory}/{export.RUN_RECORD_FILE}"] and MARKER not in _listing(directory)
  export.check_model_dir(directory, checkpoint_dir=str(tmp_path / "checkpoints"))  # the restart: its own
  export.check_model_dir(directory, checkpoint_dir=str(tmp_path / "checkpoints") + "/")  # however it is written
  with pytest.raises(UserError, match=r"holds the export of another run \(its checkpoints in .*/checkpoints\)"):
    export.check_model_dir(directory, checkpoint_dir=str(tmp_path / "other-run"))


def test_paths_name_the_same_place_however_written(tmp_path, monkeypatch):
  from trainer.core import paths  # pylint: disable=g-import-not-at-top

  assert paths.same_location("/gcs/b/run/checkpoints", "gs://b/run/checkpoints/")
  assert paths.same_location("gs://b/run/", "gs://b/run")
  assert not paths.same_location("gs://b/run", "gs://b/run2")
  assert not paths.same_location("gs://b/run", "gs://c/run")
  monkeypatch.chdir(tmp_path)
  assert paths.same_location("out/", f"{tmp_path}/out")
  assert not paths.same_location("out", f"{tmp_path}/other")
