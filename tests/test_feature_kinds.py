"""Each feature kind in one place (trainer/data/feature_kinds.py): its Example list and parse spec, its serving input,
what the encoder makes of it and the model input that must match, its OpenAPI schema, and the one Example writer,
checked for every kind on one schema that holds them all."""

import io

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

from trainer.data import feature_kinds
from trainer.data import features as features_lib
from trainer.data import predict_schemata
from trainer.data import schema as schema_lib
from trainer.data.formats import tfrecord
from trainer.modeling import models
from trainer.planning import examples

# The quick tier (scripts/test.sh --quick): no test here trains for long or waits on peers.
pytestmark = pytest.mark.quick

SCHEMA = schema_lib.parse_schema({
    "features": [
        {"name": "age", "type": "float", "mean": 40.0, "std": 10.0},
        {"name": "visits", "type": "int", "default": 0},
        {"name": "readings", "type": "float", "shape": [3]},
        {"name": "plan", "type": "string", "vocabulary": ["basic", "pro"]},
        {"name": "note", "type": "text", "vocabulary": ["late", "bill"], "sequence_length": 8},
        {"name": "raw pixels", "type": "image", "shape": [4, 4, 1]},
        {"name": "photo", "type": "image", "shape": [4, 4, 3], "encoding": "png"},
    ],
    "label": {"name": "churned", "type": "string", "vocabulary": ["no", "yes"]}}, source="test")


def _png(height, width):
  buffer = io.BytesIO()
  Image.fromarray(np.full((height, width, 3), 200, np.uint8)).save(buffer, format="PNG")
  return buffer.getvalue()


RECORD = {"age": 31.5, "visits": 4, "readings": np.array([1.0, 2.0, 3.0]), "plan": "pro",
          "note": "Late bill, again: café", "raw pixels": np.arange(16, dtype=np.uint8).reshape(4, 4, 1),
          "photo": _png(6, 6), "churned": "yes"}


def test_every_schema_type_has_one_kind():
  assert all(name == kind.type for name, kind in feature_kinds.KINDS.items())
  # The built-in types as a tf.train.Example holds them and the input pipeline parses them (a test may register
  # another for its duration: tests/test_formats.py).
  built_in = {name: (kind.holds, kind.example_list, kind.parse_dtype) for name, kind in feature_kinds.KINDS.items()
              if name in ("float", "int", "string", "text", "image")}
  assert built_in == {"float": (feature_kinds.NUMBER, "float_list", "float32"),
                      "int": (feature_kinds.NUMBER, "int64_list", "int64"),
                      "string": (feature_kinds.STRING, "bytes_list", "string"),
                      "text": (feature_kinds.STRING, "bytes_list", "string"),
                      "image": (feature_kinds.BYTES, "bytes_list", "string")}
  assert [name for name, kind in feature_kinds.KINDS.items() if kind.categorical] == ["string"]
  assert [name for name, kind in feature_kinds.KINDS.items() if kind.image] == ["image"]
  assert sorted(name for name, kind in feature_kinds.KINDS.items() if kind.takes_uri) == ["image", "text"]
  for feature in SCHEMA.features:
    assert feature.kind.type == feature.type


def test_no_module_compares_a_feature_type_by_name():
  """What the trainer needs of a feature's type it asks the type's kind (`feature.kind`: what a record holds, its
  Example list, its encoding, ...): no module but feature_kinds.py compares a `.type` with a type's name, so a new
  kind is one class there (tests/test_formats.py::test_a_new_feature_kind_is_one_registered_class adds one)."""
  import source_checks  # pylint: disable=g-import-not-at-top

  assert not source_checks.comparisons_naming(feature_kinds.KINDS, owner="data/feature_kinds.py",
                                              attribute="type")


def test_the_one_example_writer_round_trips_through_the_parse_spec():
  parsed = tf.io.parse_example([examples.serialize(RECORD, SCHEMA)], tfrecord.parse_spec(SCHEMA))
  assert parsed["age"].numpy().tolist() == [31.5] and parsed["visits"].numpy().tolist() == [4]
  assert parsed["readings"].numpy().tolist() == [[1.0, 2.0, 3.0]]
  assert parsed["plan"].numpy().tolist() == [b"pro"] and parsed["churned"].numpy().tolist() == [b"yes"]
  assert parsed["note"].numpy().tolist() == ["Late bill, again: café".encode()]
  assert parsed["raw pixels"].numpy()[0] == RECORD["raw pixels"].tobytes()
  assert parsed["photo"].numpy()[0] == RECORD["photo"]
  # A missing value is an absent feature; the schema's default fills it.
  without = tf.io.parse_example([examples.serialize({**RECORD, "visits": None}, SCHEMA)],
                                tfrecord.parse_spec(SCHEMA))
  assert without["visits"].numpy().tolist() == [0]


def test_what_serving_takes_encodes_to_what_the_model_takes():
  """For every kind: a batch shaped as the serving input, through the encoder, is exactly the model input."""
  parsed = tf.io.parse_example([examples.serialize(RECORD, SCHEMA)] * 2, tfrecord.parse_spec(SCHEMA))
  serving_specs = features_lib.raw_serving_specs(SCHEMA)
  request = {}
  for feature in SCHEMA.features:
    kind = feature.kind
    value = parsed[feature.name]
    if kind.serving_input(feature).dtype != "string":
      value = kind.encode(feature, value)  # a request carries numbers where the signature takes numbers
    assert serving_specs[feature.name].is_compatible_with(tf.TensorSpec.from_tensor(value)), feature.name
    request[feature.name] = value
  encoded = features_lib.FeatureEncoder(SCHEMA).encode(request)
  keras_inputs = models.model_inputs(SCHEMA)
  sample = models.sample_batch(SCHEMA, 2)
  for feature in SCHEMA.features:
    spec = feature.kind.model_input(feature)
    got = encoded[feature.input_name]
    assert tuple(got.shape) == (2,) + spec.shape and got.dtype.name == spec.dtype, feature.name
    assert tuple(keras_inputs[feature.input_name].shape) == (None,) + spec.shape
    assert tuple(sample[feature.input_name].shape) == (2,) + spec.shape
  assert encoded["plan"].numpy().tolist() == [2, 2]  # "pro" is vocabulary entry 2 (0 is out of vocabulary)
  assert encoded["note"].numpy().tolist() == ["Late bill, again: café".encode()] * 2  # text: the raw string
  assert encoded["photo"].numpy().max() == pytest.approx(200.0)  # a 6x6 PNG decoded and resized to 4x4


def test_the_openapi_schema_of_each_kind_accepts_a_request_value():
  from openapi_schema_validator import OAS30Validator  # pylint: disable=g-import-not-at-top

  instance = {"age": 31.5, "visits": 4.0, "readings": [1.0, 2.0, 3.0], "plan": "pro", "note": "late",
              "raw_pixels": np.zeros((4, 4, 1)).tolist(), "photo": {"b64": "iVBORw0KGgo="}}
  OAS30Validator(predict_schemata.instance_schema(SCHEMA)).validate(instance)
  with pytest.raises(Exception):
    OAS30Validator(predict_schemata.instance_schema(SCHEMA)).validate({**instance, "readings": [1.0]})


@pytest.mark.parametrize("name,kind", [("age", "number"), ("readings", "array"), ("plan", "string"),
                                       ("note", "string"), ("photo", "image")])
def test_json_kinds(name, kind):
  feature = SCHEMA.feature(name)
  assert feature.kind.json_kind(feature) == kind


def _files(tmp_path, sizes):
  paths = []
  for i, size in enumerate(sizes):
    path = tmp_path / f"f{i}.bin"
    path.write_bytes(bytes([65 + i]) * size)
    paths.append(str(path))
  return paths


def test_the_file_cache_serves_held_files_from_memory_within_its_budget(tmp_path):
  """What --uri_cache_mb keeps: a batch's files once read are served from memory (a file changed on disk after
  is still read as it was held: no second request), in the batch's order, duplicates included; a batch that
  would pass the budget is read and not held."""
  small = _files(tmp_path, [10, 20, 30])
  cache = feature_kinds.FileCache(100)
  read = tf.function(cache.read)
  batch = tf.constant([small[2], small[0], small[2], small[1]])
  expected = [b"C" * 30, b"A" * 10, b"C" * 30, b"B" * 20]
  assert list(read(batch).numpy()) == expected
  for path in small:
    with open(path, "wb") as f:
      f.write(b"changed on disk")
  assert list(read(batch).numpy()) == expected  # from memory
  (tmp_path / "big").mkdir()
  (big,) = _files(tmp_path / "big", [200])
  assert list(read(tf.constant([big, small[1]])).numpy()) == [b"A" * 200, b"B" * 20]
  with open(big, "wb") as f:
    f.write(b"new")
  assert list(read(tf.constant([big])).numpy()) == [b"new"]  # over the budget: never held, read every time


def test_the_file_cache_never_answers_with_another_files_bytes(tmp_path):
  """Entries are keyed by the URI's hash: an entry under a URI's key that holds another URI (a shared hash) is a
  miss, and the file is read."""
  first, second = _files(tmp_path, [5, 7])
  cache = feature_kinds.FileCache(1000)
  key = tf.strings.to_hash_bucket_fast([first], 2**63 - 1)
  cache._contents.insert(key, tf.constant([second + "\0" + "B" * 7]))  # pylint: disable=protected-access
  assert list(cache.read(tf.constant([first, second])).numpy()) == [b"A" * 5, b"B" * 7]
