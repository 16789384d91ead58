"""SavedModel export with a `serving_default` signature every serving stack loads.

The signature takes the raw features by name (strings for categorical columns, floats for numbers and
images; PNG/JPEG images as their bytes), applies the same `FeatureEncoder` as training, and returns named
outputs: `probabilities` and `class_id` (and `class_name` for a string label) for classification, `prediction`
for regression.

Why the saved object is not the model: TF Serving (inside Vertex's prebuilt TF prediction containers) and
`saved_model_cli run` load a SavedModel the TF1 way, running the MetaGraph's restore op in a session and then the
signature. When a Keras 3 model is an attribute of the saved `tf.Module`, the checkpoint is written through
Keras 3's own variable wrappers, and the restore op does not initialize the resource handles the signature's
graph reads ("Could not find variable output/kernel"); the TF2 loader (`tf.saved_model.load`) hides this.
So the saved root holds exactly what the serving function captures, as plain TensorFlow objects: the
`tf.Variable`s it reads, the lookup tables it uses, and the function. That is how Keras 3's own
`ExportArchive` saves, and it works the same under tf_keras and under every strategy (a distributed
variable is saved as its value).
"""

from __future__ import annotations

import dataclasses
import tempfile
import uuid
from typing import Any

from trainer.core import paths
from trainer.core import storage
from trainer.core.errors import UserError
from trainer.data import features as features_lib
from trainer.data import predict_schemata
from trainer.data import schema as schema_lib
from trainer.modeling import models

# Beside the SavedModel: the metrics (written last: their presence means the export is complete), the resolved run
# (config, schema, plan; published first: it says whose export the dir holds), the schema the export serves with (the format --schema reads, inferred ones included),
# and what Model Registry shows as the request and response (OpenAPI schemata; JSON is YAML).
METRICS_FILE = "eval_metrics.json"
RUN_RECORD_FILE = "trainer_config.json"


def served_schema(model, schema: schema_lib.Schema) -> schema_lib.Schema:
  """The schema of what the model takes. A feature it never sees (a CNN's tabular columns, the string column a
  plug-in over the numeric vector leaves out) is no input of the export, so a request need not carry it; sent
  anyway, it is ignored as any field that is not an input is (serving/predict.py)."""
  names = models.input_names(model)
  if names is None:
    return schema  # a subclassed model over the dict: it may read any feature
  return dataclasses.replace(schema, features=tuple(f for f in schema.features if f.input_name in names))


def serving_root(model, schema: schema_lib.Schema):
  """A trackable holding the `serve` function and the variables and tables it uses; not the model itself."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  schema = served_schema(model, schema)
  encoder = features_lib.FeatureEncoder(schema)
  names = models.input_names(model)

  @tf.function
  def serve(features):
    encoded = encoder.encode(features)
    # Served as float32 whatever --precision computed in (mixed policies end in float16/bfloat16 otherwise).
    outputs = tf.cast(model(models.select_inputs(encoded, names), training=False), tf.float32)
    if schema.task == "multi_label":
      # Every class's own probability (they need not sum to 1) and the yes/no at 0.5; class_names[i] is class i's
      # name, repeated per example as a response lists it beside the probabilities.
      probabilities = tf.sigmoid(outputs)
      class_names = tf.constant(list(schema.label.vocabulary))
      return {"probabilities": probabilities, "predicted": tf.cast(probabilities > 0.5, tf.int64),
              "class_names": tf.tile(class_names[None, :], [tf.shape(outputs)[0], 1])}
    if schema.task == "classification":
      class_id = tf.argmax(outputs, axis=-1, output_type=tf.int64)
      result = {"probabilities": tf.nn.softmax(outputs, axis=-1), "class_id": class_id}
      if schema.label.vocabulary:
        result["class_name"] = tf.gather(tf.constant(list(schema.label.vocabulary)), class_id)
      return result
    return {"prediction": tf.reshape(outputs, [-1])}

  root = tf.__internal__.tracking.AutoTrackable()
  root.serve = serve
  concrete = serve.get_concrete_function(features_lib.raw_serving_specs(schema))
  # The exact tf.Variable objects the graph reads (Keras 3 wraps them; tf_keras hands them out directly).
  root.variables = list(concrete.variables)
  root.tables = encoder.tables + _model_resources(model)
  return root, concrete


def _model_resources(model) -> list:
  """Lookup tables and other resources a plug-in model holds itself (e.g. a StringLookup layer)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from tensorflow.saved_model.experimental import TrackableResource  # pylint: disable=g-import-not-at-top

  # Not guarded: a model that cannot be walked would export without its tables and fail only when served.
  return [t for t in tf.train.TrackableView(model).descendants() if isinstance(t, TrackableResource)]


def export_saved_model(model, schema: schema_lib.Schema, directory: str) -> None:
  """Writes the SavedModel to `directory`; on failure removes what was half-written."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  root, signature = serving_root(model, schema)
  try:
    tf.saved_model.save(root, directory, signatures={"serving_default": signature})
  except BaseException:
    storage.remove_tree(directory)
    raise


# What a SavedModel export consists of (and the config the runner writes beside it): replaced on publishing.
_EXPORT_ENTRIES = ("saved_model.pb", "saved_model.pbtxt", "fingerprint.pb", "variables", "assets", "assets.extra")


def _publish(staging: str, directory: str, *, complete_marker: str, replaced: tuple[str, ...],
             first: tuple[str, ...] = ()) -> None:
  """Copies the staged export into `directory` (local or gs://: one code path; an export is a few files).

  The `first` entries (the run record, which says whose export this is) are copied right after the marker is
  removed, before anything else changes: a restart after a kill anywhere in here finds its own run's record."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  marker = paths.join_path(directory, complete_marker)
  if tf.io.gfile.exists(marker):
    tf.io.gfile.remove(marker)  # first: from here until the runner writes it again, this is no result
  tf.io.gfile.makedirs(directory)
  for name in first:
    tf.io.gfile.copy(paths.join_path(staging, name), paths.join_path(directory, name), overwrite=True)
  for name in replaced:
    if name in first:
      continue
    path = paths.join_path(directory, name)
    if tf.io.gfile.isdir(path):
      storage.remove_tree(path)
    elif tf.io.gfile.exists(path):
      tf.io.gfile.remove(path)
  for root, _, files in tf.io.gfile.walk(staging):
    relative = root[len(staging):].strip("/")
    target = paths.join_path(directory, relative) if relative else directory
    tf.io.gfile.makedirs(target)
    for name in files:
      if relative or name not in first:
        tf.io.gfile.copy(paths.join_path(root, name), paths.join_path(target, name), overwrite=True)


def _remove_stale_staging(directory: str) -> None:
  """Staging dirs beside `directory` that an interrupted export left (a chief killed or preempted inside one):
  removed before this export stages its own. Only the run's chief exports into a model dir, and the run-dir lock
  keeps a second job off it, so nothing else can be writing one."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from absl import logging  # pylint: disable=g-import-not-at-top

  for stale in tf.io.gfile.glob(f"{directory.rstrip('/')}.staging-*"):
    storage.remove_tree(stale.rstrip("/"))
    logging.info("Removed %s, left by an interrupted export", stale.rstrip("/"))


def export_for_role(model, schema: schema_lib.Schema, directory: str, *, is_chief: bool,
                    complete_marker: str, side_files: dict[str, Any] | None = None,
                    first: tuple[str, ...] = ()) -> str | None:
  """Exports on every worker (saving may run collectives); only the chief's export is kept.

  The chief writes to a fresh staging dir beside `directory` and publishes only a complete export: a failed
  export leaves the previous one in `directory` untouched. Publishing removes `complete_marker` (the metrics
  file the runner writes last) before anything else changes, so a half-replaced export is never mistaken for
  a result.
  """
  if is_chief:
    _remove_stale_staging(directory)
    staging = f"{directory.rstrip('/')}.staging-{uuid.uuid4().hex[:8]}"
    export_saved_model(model, schema, staging)  # removes the staging dir itself on failure
    try:
      for name, value in (side_files or {}).items():
        storage.write_json(paths.join_path(staging, name), value)
      _publish(staging, directory, complete_marker=complete_marker,
               replaced=_EXPORT_ENTRIES + tuple(side_files or ()), first=first)
    finally:
      storage.remove_tree(staging)
    return directory
  scratch = tempfile.mkdtemp(prefix="trainer-export-worker-")
  try:
    export_saved_model(model, schema, scratch)
  finally:
    storage.remove_tree(scratch)
  return None


def check_model_dir(directory: str, *, checkpoint_dir: str) -> None:
  """--model_dir holding another run's export is refused, as a checkpoint dir held by another job is (`ownership`):
  the export would replace it and exit 0. The run an export belongs to is the checkpoint dir its run record
  names; the same run (a restart, a re-export) may replace its own."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  record_path = paths.join_path(directory, RUN_RECORD_FILE)
  owner = None
  if tf.io.gfile.exists(record_path):
    try:
      owner = storage.read_json(record_path).get("config", {}).get("output", {}).get("checkpoint_dir")
    except (ValueError, AttributeError):
      owner = None
  elif not any(tf.io.gfile.exists(paths.join_path(directory, name)) for name in ("saved_model.pb", METRICS_FILE)):
    return  # nothing there yet
  if owner is not None and paths.same_location(owner, checkpoint_dir):  # as written: /gcs/ or gs://, a slash
    return
  whose = (f"the export of another run (its checkpoints in {owner})" if owner
           else "a SavedModel this trainer did not write")
  raise UserError(f"--model_dir: {directory} holds {whose}; this run would replace it: give this run its own "
                  "--model_dir (or --output_dir), or remove that export first")


def publish(model, schema: schema_lib.Schema, directory: str, *, is_chief: bool, run_record: dict[str, Any],
            metrics: dict[str, Any]) -> str | None:
  """The run's result in `directory`: the SavedModel and the side files staged together (`export_for_role`: every
  worker exports, the chief's is kept; the run record is published first), then the metrics file last, so a model
  dir with metrics holds a complete result.
  Returns the directory on the chief, None elsewhere. Another run's export there is refused (`check_model_dir`)."""
  if is_chief:
    check_model_dir(directory, checkpoint_dir=run_record["config"]["output"]["checkpoint_dir"])
  side_files = {RUN_RECORD_FILE: run_record, schema_lib.SCHEMA_FILE: schema.to_dict(),
                predict_schemata.INSTANCE_FILE: predict_schemata.instance_schema(served_schema(model, schema)),
                predict_schemata.PREDICTION_FILE: predict_schemata.prediction_schema(schema)}
  exported = export_for_role(model, schema, directory, is_chief=is_chief, complete_marker=METRICS_FILE,
                             side_files=side_files if is_chief else None, first=(RUN_RECORD_FILE,))
  if exported:
    storage.write_json(paths.join_path(exported, METRICS_FILE), metrics)
  return exported
