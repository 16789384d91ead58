"""Vertex Model Registry predict schemata: OpenAPI 3.0 schema objects of one instance and one prediction, as
the serving signature takes and returns them, derived from the schema the export serves with.

Vertex reads them from `Model.predictSchemata.{instance,prediction}SchemaUri` (YAML files in Cloud Storage); the
export writes them beside the SavedModel (JSON is YAML), and `scripts/submit.py --upload_model` points at them.
"""

from __future__ import annotations

from typing import Any

from trainer import schema as schema_lib

INSTANCE_FILE = "instance_schema.yaml"
PREDICTION_FILE = "prediction_schema.yaml"


def instance_schema(schema: schema_lib.Schema) -> dict[str, Any]:
  """One instance: a JSON object with a value per feature, keyed by the serving input's name."""
  properties = {feature.input_name: _feature_schema(feature) for feature in schema.features}
  return {"title": "instance", "type": "object", "required": list(properties), "properties": properties}


def _feature_schema(feature: schema_lib.Feature) -> dict[str, Any]:
  if feature.type == "string":
    value: dict[str, Any] = {"type": "string"}
    if feature.vocabulary:
      value["description"] = f"one of {len(feature.vocabulary)} known values; others map to the OOV bucket"
    return value
  if feature.type == "image" and feature.encoding in ("png", "jpeg"):
    # Binary strings travel as {"b64": ...} in Vertex's JSON instances.
    return {"type": "object", "required": ["b64"],
            "properties": {"b64": {"type": "string", "format": "byte"}},
            "description": f"{feature.encoding.upper()} bytes, base64"}
  number = {"type": "number", "format": "float"}
  if feature.type == "image":
    shaped: dict[str, Any] = number
    for size in reversed(feature.shape or ()):
      shaped = {"type": "array", "items": shaped, "minItems": size, "maxItems": size}
    return shaped
  if feature.values_per_example > 1:
    return {"type": "array", "items": number, "minItems": feature.values_per_example,
            "maxItems": feature.values_per_example}
  return number


def prediction_schema(schema: schema_lib.Schema) -> dict[str, Any]:
  """One prediction, as the serving signature's outputs (see trainer/export.py)."""
  if schema.task == "regression":
    properties: dict[str, Any] = {"prediction": {"type": "number", "format": "float"}}
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
