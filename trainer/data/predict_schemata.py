"""Vertex Model Registry predict schemata: OpenAPI 3.0 schema objects of one instance and one prediction, as
the serving signature takes and returns them, derived from the schema the export serves with.

Vertex reads them from `Model.predictSchemata.{instance,prediction}SchemaUri` (YAML files in Cloud Storage); the
export writes them beside the SavedModel (JSON is YAML), and `scripts/submit.py --upload_model` points at them.
"""

from __future__ import annotations

from typing import Any

from trainer.data import schema as schema_lib

INSTANCE_FILE = "instance_schema.yaml"
PREDICTION_FILE = "prediction_schema.yaml"


def instance_schema(schema: schema_lib.Schema) -> dict[str, Any]:
  """One instance: a JSON object with a value per feature, keyed by the serving input's name."""
  properties = {feature.input_name: feature.kind.openapi(feature) for feature in schema.features}
  return {"title": "instance", "type": "object", "required": list(properties), "properties": properties}


def prediction_schema(schema: schema_lib.Schema) -> dict[str, Any]:
  """One prediction, as the serving signature's outputs (see trainer/modeling/export.py)."""
  if schema.task == "regression":
    properties: dict[str, Any] = {"prediction": {"type": "number", "format": "float"}}
  elif schema.task == "multi_label":
    classes = schema.label.num_classes
    per_class = {"minItems": classes, "maxItems": classes}
    properties = {
        "probabilities": {"type": "array", "items": {"type": "number", "format": "float"}, **per_class},
        "predicted": {"type": "array", "items": {"type": "integer", "format": "int64", "enum": [0, 1]},
                      **per_class},
        "class_names": {"type": "array", "items": {"type": "string", "enum": list(schema.label.vocabulary)},
                        **per_class},
    }
  else:
    classes = schema.label.num_classes
    properties = {
        "probabilities": {"type": "array", "items": {"type": "number", "format": "float"}, "minItems": classes,
                          "maxItems": classes},
        "class_id": {"type": "integer", "format": "int64", "minimum": 0, "maximum": classes - 1},
    }
    if schema.label.vocabulary:
      properties["class_name"] = {"type": "string", "enum": list(schema.label.vocabulary)}
  return {"title": "prediction", "type": "object", "required": list(properties), "properties": properties}
