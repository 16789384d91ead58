"""SavedModel export with a `serving_default` signature Vertex AI's prebuilt prediction containers take.

The signature takes the raw features by name (strings for categorical columns, floats for numbers and
images), applies the same `FeatureEncoder` as training, and returns named outputs: `probabilities` and
`class_id` for classification, `prediction` for regression.
"""

from __future__ import annotations

import tempfile

from trainer import data as data_lib
from trainer import models
from trainer import schema as schema_lib
from trainer import storage


def _serving_module(model, schema: schema_lib.Schema):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  class ServingModule(tf.Module):

    def __init__(self):
      super().__init__(name="serving")
      self.model = model
      self.encoder = data_lib.FeatureEncoder(schema)
      self.tables = self.encoder.tables  # tracked, so the vocabularies are saved as assets
      self.input_names = models.input_names(model)

    @tf.function
    def serve(self, features):
      encoded = self.encoder.encode(features)
      outputs = self.model(models.select_inputs(encoded, self.input_names), training=False)
      if schema.task == "classification":
        return {"probabilities": tf.nn.softmax(outputs, axis=-1),
                "class_id": tf.argmax(outputs, axis=-1, output_type=tf.int64)}
      return {"prediction": tf.reshape(outputs, [-1])}

  return ServingModule()


def export_saved_model(model, schema: schema_lib.Schema, directory: str) -> None:
  """Writes the SavedModel to `directory`; on failure removes what was half-written."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  module = _serving_module(model, schema)
  signature = module.serve.get_concrete_function(data_lib.raw_serving_specs(schema))
  try:
    tf.saved_model.save(module, directory, signatures={"serving_default": signature})
  except BaseException:
    storage.remove_tree(directory)
    raise


def export_for_role(model, schema: schema_lib.Schema, directory: str, *, is_chief: bool) -> str | None:
  """Exports on every worker (saving may run collectives); only the chief's export is kept."""
  if is_chief:
    export_saved_model(model, schema, directory)
    return directory
  scratch = tempfile.mkdtemp(prefix="trainer-export-worker-")
  try:
    export_saved_model(model, schema, scratch)
  finally:
    storage.remove_tree(scratch)
  return None
