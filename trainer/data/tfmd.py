"""A TFX / TensorFlow Data Validation schema (`schema.pbtxt`, tensorflow_metadata's `Schema` proto) as ours.

TFDV's `infer_schema` and TFX's SchemaGen write it. It says types, value counts and vocabularies (string
domains), not means or standard deviations, and it does not mark the label: `--label` names it (else the one
feature kept out of the SERVING environment, as TFX pipelines declare labels). tensorflow-metadata is imported
only here, so the trainer does not need it unless a `.pbtxt` is given (`pip install vertex-tf-trainer[tfx]`).

Mapped: FLOAT -> float; INT -> int; BYTES with a string domain -> string over its values; a fixed shape or
value count of N > 1 -> shape [N]; the label: INT with an int domain -> classes `0..max`, BYTES with a string
domain -> class names, FLOAT -> regression. Anything else (images, BYTES without a vocabulary, ragged values) is
one error naming the feature: write a schema.json for it.
"""

from __future__ import annotations

from typing import Any

from trainer.core.errors import UserError


def schema_from_text(text: str, *, label: str | None, source: str) -> dict[str, Any]:
  """Our schema JSON object (for `schema.parse_schema`) from the text of a `schema.pbtxt`."""
  try:
    from google.protobuf import text_format  # pylint: disable=g-import-not-at-top
    from tensorflow_metadata.proto.v0 import schema_pb2  # pylint: disable=g-import-not-at-top
  except ImportError:
    raise UserError(f"--schema={source} is a TFX/TFDV schema, which needs tensorflow-metadata: pip install "
                    "tensorflow-metadata (or vertex-tf-trainer[tfx]), or pass a schema.json") from None
  proto = schema_pb2.Schema()
  try:
    text_format.Parse(text, proto)
  except text_format.ParseError as e:
    raise UserError(f"schema {source} is not a tensorflow_metadata Schema text proto ({e})") from None
  domains = {d.name: list(d.value) for d in proto.string_domain}
  if label is None:
    outside_serving = [f.name for f in proto.feature if "SERVING" in f.not_in_environment]
    if len(outside_serving) != 1:
      several = f"; several are kept out of SERVING: {', '.join(outside_serving)}" if outside_serving else ""
      raise UserError(f"schema {source}: pass --label to say which feature is the label (a TFX schema marks "
                      f"none{several})")
    label = outside_serving[0]
  names = [f.name for f in proto.feature]
  if label not in names:
    raise UserError(f"--label={label!r} is not a feature of the schema {source} (features: {', '.join(names)})")
  features, label_value = [], None
  for feature in proto.feature:
    kind = schema_pb2.FeatureType.Name(feature.type)
    vocabulary = _vocabulary(feature, domains)
    size = _fixed_size(feature, source)
    where = f"schema {source}: feature {feature.name!r}"
    if feature.name == label:
      if size != 1:
        raise UserError(f"{where}: a label has one value per example, this one {size}")
      if kind == "INT" and feature.HasField("int_domain") and feature.int_domain.HasField("max"):
        label_value = {"name": label, "type": "int", "num_classes": max(2, int(feature.int_domain.max) + 1)}
      elif kind == "BYTES" and vocabulary:
        label_value = {"name": label, "type": "string", "vocabulary": vocabulary}
      elif kind == "FLOAT":
        label_value = {"name": label, "type": "float"}
      else:
        raise UserError(f"{where} (the label) is {kind} without an int_domain max or string domain; the trainer "
                        "cannot tell its classes: write a schema.json")
      continue
    if kind == "FLOAT" or kind == "INT":
      value: dict[str, Any] = {"name": feature.name, "type": "float" if kind == "FLOAT" else "int"}
      if size > 1:
        value["shape"] = [size]
    elif kind == "BYTES" and vocabulary:
      value = {"name": feature.name, "type": "string", "vocabulary": vocabulary}
    else:
      raise UserError(f"{where} is {kind}{' without a string domain' if kind == 'BYTES' else ''}; the trainer "
                      "reads numbers and categorical strings from a TFX schema: write a schema.json for it")
    features.append(value)
  return {"features": features, "label": label_value}


def _vocabulary(feature, domains: dict[str, list[str]]) -> list[str] | None:
  if feature.HasField("string_domain"):
    return list(feature.string_domain.value)
  if feature.domain:
    return domains.get(feature.domain)
  return None


def _fixed_size(feature, source: str) -> int:
  if feature.HasField("shape"):
    size = 1
    for dim in feature.shape.dim:
      size *= dim.size
    return size
  if feature.HasField("value_count"):
    low, high = feature.value_count.min, feature.value_count.max
    if low == high and low >= 1:
      return low
    if high > 1 or low != high:
      raise UserError(f"schema {source}: feature {feature.name!r} has {low}..{high} values per example; the "
                      "trainer needs a fixed number (a shape)")
  return 1
