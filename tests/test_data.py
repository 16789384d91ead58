"""Input pipelines: sharding per input pipeline, TFRecord/CSV parity, and bad data caught up front."""

import glob
import json
import os

import numpy as np
import pytest
import tensorflow as tf

from trainer.core import storage
from trainer.core.errors import UserError
from trainer.data import features as features_lib
from trainer.data import formats
from trainer.data import input_pipeline
from trainer.data import schema as schema_lib
from trainer.planning import preflight

# The quick tier (scripts/test.sh --quick): no test here trains for long or waits on peers.
pytestmark = pytest.mark.quick


@pytest.fixture(scope="module")
def churn(churn_data):
  schema = schema_lib.load_schema(os.path.join(churn_data, "train", "schema.json"))
  files = sorted(glob.glob(os.path.join(churn_data, "train", "*.tfrecord")))
  return schema, files


def _ids(dataset, take):
  """A fingerprint per example (every column) to compare what pipelines read."""
  seen = set()
  for features, labels in dataset.take(take):
    columns = [features[name].numpy().tolist() for name in sorted(features)] + [labels.numpy().tolist()]
    seen.update(zip(*columns))
  return seen


def test_files_are_sharded_per_input_pipeline(churn):
  schema, files = churn
  assert len(files) == 4
  parts = []
  for pipeline in range(2):
    context = tf.distribute.InputContext(num_input_pipelines=2, input_pipeline_id=pipeline, num_replicas_in_sync=2)
    fn = input_pipeline.make_dataset_fn(files, schema, source=formats.TFRECORD, global_batch_size=64, training=False,
                              repeat=False)
    ds = fn(context)
    first = next(iter(ds))
    assert first[1].shape == (32,)  # per-replica batch
    parts.append(_ids(ds, 1000))
  assert parts[0] and parts[1]
  assert not parts[0] & parts[1], len(parts[0] & parts[1])  # disjoint
  everything = _ids(input_pipeline.make_dataset_fn(files, schema, source=formats.TFRECORD, global_batch_size=1,
                                         training=False, repeat=False)(None), 10_000)
  assert len(everything) >= 3990  # 4000 examples (a few duplicate pairs possible)
  assert len(parts[0] | parts[1]) >= len(everything) - 64  # drop_remainder loses < 1 batch per pipeline


def test_records_are_sharded_when_files_are_fewer_than_pipelines(churn):
  schema, files = churn
  one_file = files[:1]
  parts = []
  for pipeline in range(2):
    context = tf.distribute.InputContext(num_input_pipelines=2, input_pipeline_id=pipeline, num_replicas_in_sync=2)
    ds = input_pipeline.make_dataset_fn(one_file, schema, source=formats.TFRECORD, global_batch_size=20, training=False,
                              repeat=False)(context)
    parts.append(_ids(ds, 1000))
  assert parts[0] and parts[1] and not parts[0] & parts[1]


def test_csv_and_tfrecord_give_the_same_examples(churn_data, churn):
  schema, files = churn
  csv_files = sorted(glob.glob(os.path.join(churn_data, "train", "*.csv")))
  source = formats.csv_source(formats.Source("csv"), csv_files[0], columns=None, flag="--train_data")
  assert source.header and source.columns[0] == "tenure_months"
  from_csv = input_pipeline.make_dataset_fn(csv_files, schema, source=source, global_batch_size=50, training=False,
                                  repeat=False)(None)
  from_tfrecord = input_pipeline.make_dataset_fn(files, schema, source=formats.TFRECORD, global_batch_size=50,
                                       training=False, repeat=False)(None)
  a_features, a_labels = next(iter(from_csv))
  b_features, b_labels = next(iter(from_tfrecord))
  np.testing.assert_array_equal(a_labels.numpy(), b_labels.numpy())
  for name in ("tenure_months", "plan", "region", "support_calls"):
    np.testing.assert_allclose(a_features[name].numpy(), b_features[name].numpy(), rtol=1e-6)
  # Vocabulary ids: 0 is out-of-vocabulary, the vocabulary starts at 1.
  assert set(np.unique(b_features["plan"].numpy())) <= {1, 2, 3}


def test_training_pipeline_shuffles_and_repeats(churn):
  schema, files = churn
  ds = input_pipeline.make_dataset_fn(files, schema, source=formats.TFRECORD, global_batch_size=1000, training=True,
                            seed=1)(None)
  batches = [labels.numpy() for _, labels in ds.take(6)]  # 6000 > 4000 examples: it repeats
  assert len(batches) == 6


@pytest.fixture(scope="module")
def numbered(tmp_path_factory):
  """One file of 3000 records whose `id` feature is its position in the file."""
  directory = tmp_path_factory.mktemp("numbered")
  path = str(directory / "numbered.tfrecord")
  with tf.io.TFRecordWriter(path) as writer:
    for i in range(3000):
      feature = {"id": tf.train.Feature(float_list=tf.train.FloatList(value=[float(i)])),
                 "y": tf.train.Feature(int64_list=tf.train.Int64List(value=[i % 2]))}
      writer.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())
  schema = schema_lib.parse_schema({"features": [{"name": "id", "type": "float"}],
                                    "label": {"name": "y", "type": "int", "num_classes": 2}}, source="test")
  return schema, [path]


def _id_batches(numbered, *, seed, batch=100, shuffle_buffer=1000, repeat=False, take=-1, deterministic=True):
  schema, files = numbered
  ds = input_pipeline.make_dataset_fn(files, schema, source=formats.TFRECORD, global_batch_size=batch, training=True,
                            shuffle_buffer=shuffle_buffer, seed=seed, repeat=repeat, deterministic=deterministic)
  return [features["id"].numpy().astype(int) for features, _ in ds(None).take(take)]


def test_shuffle_mixes_rows_across_a_window_and_keeps_every_example(numbered):
  batches = _id_batches(numbered, seed=3)
  assert len(batches) == 30 and all(b.shape == (100,) for b in batches)
  # Every example exactly once per pass: a permutation, nothing dropped or repeated.
  assert sorted(np.concatenate(batches).tolist()) == list(range(3000))
  # 1000 examples per window = 10 batches: each batch draws from its whole window, not from 100 neighbours.
  for number, ids in enumerate(batches):
    window = number // 10
    assert ids.min() >= 1000 * window and ids.max() < 1000 * (window + 1), (number, ids.min(), ids.max())
    assert len(set((ids - 1000 * window) // 100)) >= 7, sorted(ids)  # rows from >= 7 of the 10 source batches
    assert not np.all(np.diff(ids) > 0)
  # The same seed repeats the order exactly; another seed gives another one.
  assert all(np.array_equal(a, b) for a, b in zip(batches, _id_batches(numbered, seed=3)))
  assert not all(np.array_equal(a, b) for a, b in zip(batches, _id_batches(numbered, seed=4)))


def test_shuffle_reshuffles_every_pass_and_small_buffers_still_pool_two_batches(numbered):
  passes = _id_batches(numbered, seed=3, repeat=True, take=60)
  first, second = np.concatenate(passes[:30]), np.concatenate(passes[30:])
  assert sorted(first.tolist()) == sorted(second.tolist()) == list(range(3000))
  assert not np.array_equal(first, second)
  assert input_pipeline.shuffle_window_batches(1, 100) == 2 and input_pipeline.shuffle_window_batches(1000, 100) == 10
  assert input_pipeline.shuffle_window_batches(1001, 100) == 11
  pooled = _id_batches(numbered, seed=3, shuffle_buffer=1)
  assert any(ids.max() >= 100 * (number // 2 * 2 + 1) for number, ids in enumerate(pooled))  # crosses batches
  assert all(np.array_equal(a, np.arange(100 * n, 100 * (n + 1)))
             for n, a in enumerate(_id_batches(numbered, seed=3, shuffle_buffer=0)))  # 0: file order


def test_unseeded_shuffle_differs_between_runs(numbered):
  first = np.concatenate(_id_batches(numbered, seed=None, take=10))
  assert not np.array_equal(first, np.concatenate(_id_batches(numbered, seed=None, take=10)))


def test_unknown_vocabulary_value_maps_to_zero(churn):
  schema, _ = churn
  encoder = features_lib.FeatureEncoder(schema)
  encoded = encoder.encode({"tenure_months": tf.constant([1.0]), "monthly_charges": tf.constant([2.0]),
                            "support_calls": tf.constant([1], tf.int64), "plan": tf.constant(["platinum"]),
                            "region": tf.constant(["east"])})
  assert encoded["plan"].numpy().tolist() == [0]
  assert encoded["region"].numpy().tolist() == [3]


def test_empty_pattern_names_the_flag(tmp_path):
  with pytest.raises(UserError, match=r"^--train_data: no files match '.*/nothing-\*'; expected a file pattern"):
    storage.list_files(str(tmp_path / "nothing-*"), flag="--train_data")


def _write_example(path, **features):
  with tf.io.TFRecordWriter(path) as writer:
    feature = {}
    for name, value in features.items():
      if isinstance(value, float):
        feature[name] = tf.train.Feature(float_list=tf.train.FloatList(value=[value]))
      elif isinstance(value, int):
        feature[name] = tf.train.Feature(int64_list=tf.train.Int64List(value=[value]))
      else:
        feature[name] = tf.train.Feature(bytes_list=tf.train.BytesList(value=[value.encode()]))
    writer.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())


def _check_first(path, schema, fmt, flag="--train_data"):
  source = formats.resolve([str(path)], requested=fmt, vertex_format=None, flag=flag)
  if source.format == "csv":
    source = formats.csv_source(source, str(path), columns=None, flag=flag)
    formats.check_schema(schema, source, [str(path)], flag=flag)
  preflight.check_first_record(str(path), source, schema, flag=flag)


def test_record_that_does_not_match_schema(churn, tmp_path):
  schema, _ = churn
  good = dict(tenure_months=1.0, monthly_charges=2.0, support_calls=1, plan="pro", region="east", churned=1)
  path = str(tmp_path / "missing.tfrecord")
  _write_example(path, **{k: v for k, v in good.items() if k != "plan"})
  with pytest.raises(UserError, match=r"^--train_data: .*missing.tfrecord record 1: feature 'plan' is missing "
                                      r"\(the record has: .*\); it does not match the schema, which gives it no "
                                      r"default$"):
    _check_first(path, schema, "auto")
  path = str(tmp_path / "wrongtype.tfrecord")
  _write_example(path, **{**good, "tenure_months": "long"})
  with pytest.raises(UserError, match=r"^--train_data: .*wrongtype.tfrecord record 1: feature 'tenure_months' is a "
                                      r"bytes_list, but the schema says float \(float_list\)$"):
    _check_first(path, schema, "auto")
  path = str(tmp_path / "text.tfrecord")
  with open(path, "w") as f:
    f.write("this is not a tfrecord file at all")
  with pytest.raises(UserError, match=r"^--train_data: .*text.tfrecord cannot be read as TFRecord after record 0"):
    _check_first(path, schema, "auto")


def test_csv_that_does_not_match_schema(churn, tmp_path):
  schema, _ = churn
  path = tmp_path / "bad.csv"
  path.write_text("tenure_months,monthly_charges,support_calls,plan,churned\n1,2,3,pro,0\n")
  with pytest.raises(UserError, match=r"^--eval_data: the CSV columns \(.*\) lack region named in the schema$"):
    _check_first(path, schema, "auto", flag="--eval_data")
  path.write_text("tenure_months,monthly_charges,support_calls,plan,region,churned\nlong,2,3,pro,east,0\n")
  with pytest.raises(UserError, match=r"^--eval_data: .*bad.csv line 2: column 'tenure_months' holds 'long', but "
                                      r"the schema says float$"):
    _check_first(path, schema, "auto", flag="--eval_data")


@pytest.mark.parametrize("value,message", [
    ({"features": []}, r"expected an object with 'features' and 'label'"),
    ({"features": [{"name": "a", "type": "blob"}], "label": {"name": "y", "type": "float"}},
     r"feature 'a' has type 'blob'; expected one of float, int, string, text, image$"),
    ({"features": [{"name": "a", "type": "string"}], "label": {"name": "y", "type": "float"}},
     r"string feature 'a' needs a non-empty 'vocabulary' of strings$"),
    ({"features": [{"name": "a", "type": "float"}], "label": {"name": "y", "type": "int"}},
     r"int label 'y' needs 'num_classes' \(classification\); use type 'float' for regression$"),
    ({"features": [{"name": "a", "type": "image", "shape": [2, 2]}], "label": {"name": "y", "type": "float"}},
     r"image feature 'a' needs 'shape': \[height, width, channels\], got \[2, 2\]$"),
])
def test_bad_schema(value, message):
  with pytest.raises(UserError, match=r"^schema s.json: " + message):
    schema_lib.parse_schema(value, source="s.json")


def test_the_whole_schema_json_in_the_docs_is_one_the_trainer_reads():
  """docs/data.md's whole schema.json: every feature type and optional key it shows parses as it says."""
  import re  # pylint: disable=g-import-not-at-top

  docs = open(os.path.join(os.path.dirname(os.path.dirname(__file__)), "docs", "data.md")).read()
  (block,) = re.findall(r"^## A whole schema\.json\n.*?^```json\n(.*?)^```", docs, re.M | re.S)
  schema = schema_lib.parse_schema(json.loads(block), source="docs/data.md")
  assert {f.type for f in schema.features} == {"float", "int", "string", "text", "image"}
  assert (schema.feature("readings").shape, schema.feature("scan").uri) == ((4,), True)
  assert (schema.feature("plan").default, schema.feature("last_ticket").sequence_length) == ("basic", 32)
  assert (schema.label.num_classes, schema.label.vocabulary) == (2, ("no", "yes"))


def test_schema_file_errors(tmp_path):
  with pytest.raises(UserError, match=r"^--schema: file .*nope.json not found"):
    schema_lib.load_schema(str(tmp_path / "nope.json"))
  bad = tmp_path / "bad.json"
  bad.write_text("{")
  with pytest.raises(UserError, match=r"^schema .*bad.json is not valid JSON"):
    schema_lib.load_schema(str(bad))
  good = tmp_path / "good.json"
  good.write_text(json.dumps({"features": [{"name": "x", "type": "float"}],
                              "label": {"name": "y", "type": "float"}}))
  assert schema_lib.load_schema(str(good)).task == "regression"


def _fingerprints(dataset) -> list[bytes]:
  """One fingerprint per example (every column's bytes), to compare what pipelines read, for any feature kind."""
  found = []
  for features, labels in dataset:
    columns = [np.asarray(features[name].numpy()) for name in sorted(features)] + [np.asarray(labels.numpy())]
    found += [b"|".join(column[i].tobytes() for column in columns) for i in range(len(columns[-1]))]
  return found


def _churn_in(fmt: str, churn_data: str, directory) -> list[str]:
  """The churn training shards written as `fmt` the way pandas writes each (one file per CSV shard)."""
  import pandas as pd  # pylint: disable=g-import-not-at-top

  paths = []
  for path in sorted(glob.glob(os.path.join(churn_data, "train", "*.csv"))):
    target = os.path.join(directory, os.path.basename(path)[:-len(".csv")] + {"jsonl": ".jsonl",
                                                                                "parquet": ".parquet"}[fmt])
    frame = pd.read_csv(path)
    if fmt == "jsonl":
      frame.to_json(target, orient="records", lines=True)
    else:
      frame.to_parquet(target, index=False)
    paths.append(target)
  return paths


# Each format with 4 files (each pipeline its own) and 1 (every n-th record); in class folders each file is a record.
@pytest.mark.parametrize("fmt,num_files", [("csv", 4), ("csv", 1), ("jsonl", 4), ("jsonl", 1), ("parquet", 4),
                                           ("parquet", 1), ("image_folder", 400)])
def test_every_format_is_sharded_alike_per_input_pipeline(fmt, num_files, churn_data, churn, tmp_path):
  """What a multi-worker job asks of each format's reader, through the `InputContext` each worker's pipeline gets:
  two pipelines read disjoint examples that together are the whole split (evaluation: one exact pass), whether
  each reads its own files (at least as many files as pipelines) or every n-th record of one file. One real
  multi-worker run per behaviour (test_multiworker, test_gcs, test_your_data) then covers the processes."""
  schema, _ = churn
  if fmt == "image_folder":
    from scripts.public_data import write_digit_files  # pylint: disable=g-import-not-at-top

    frame = write_digit_files(str(tmp_path / "digits"), class_folders=True)
    files = sorted(frame["path"])
    schema = schema_lib.parse_schema({
        "features": [{"name": "image", "type": "image", "shape": [8, 8, 1], "encoding": "png", "uri": True}],
        "label": {"name": "label", "type": "string", "vocabulary": [f"digit_{d}" for d in range(10)]}},
        source="test")
  elif fmt == "csv":
    files = sorted(glob.glob(os.path.join(churn_data, "train", "*.csv")))
  else:
    files = _churn_in(fmt, churn_data, tmp_path)
  files = files[:num_files]
  source = formats.FORMATS[fmt].settled(formats.Source(fmt), files[0], schema, flag="--train_data")
  whole = _fingerprints(input_pipeline.make_dataset_fn(files, schema, source=source, global_batch_size=7,
                                                       training=False, repeat=False)(None))
  parts = []
  for pipeline in range(2):
    context = tf.distribute.InputContext(num_input_pipelines=2, input_pipeline_id=pipeline, num_replicas_in_sync=2)
    parts.append(_fingerprints(input_pipeline.make_dataset_fn(files, schema, source=source, global_batch_size=14,
                                                              training=False, repeat=False)(context)))
  assert parts[0] and parts[1]
  assert sorted(parts[0] + parts[1]) == sorted(whole)  # each example once, across the two pipelines
  assert len(set(whole)) > 0.99 * len(whole) and len(whole) >= 400  # distinct examples: the check can fail
