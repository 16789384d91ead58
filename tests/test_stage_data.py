"""scripts/stage_data.py on files as other tools write them: CSV with string columns, quoted commas and quotes,
empty cells, gzip, no header; JSONL and Parquet; gzip TFRecord; and bad input as one line with exit code 2.

stage_data converts through the trainer's own reader and record check, so a staged file trains as the file itself
does: an empty cell takes the schema's `default` (never its mean), and NaN, an infinity or an empty cell without a
default is refused with the line the trainer gives for the same file (tested against the trainer's own input
pipeline and error translation)."""

import csv
import gzip
import json
import re

import numpy as np
import pytest

from scripts.public_data import iris_frame
from scripts import stage_data
from trainer.core.errors import UserError
from trainer.data import formats
from trainer.data import input_pipeline
from trainer.data import schema as schema_lib
from trainer.planning import preflight

# The quick tier (scripts/test.sh --quick): no test here trains for long or waits on peers.
pytestmark = pytest.mark.quick

SCHEMA = {
    "features": [
        {"name": "age", "type": "float", "mean": 40.0, "std": 12.0, "default": 35.0},  # the default, not the mean
        {"name": "visits", "type": "int", "default": 1},
        {"name": "city", "type": "string", "vocabulary": ["Boston", "New York, NY"]},
        {"name": "note", "type": "string", "vocabulary": ["vip"], "default": ""},
    ],
    "label": {"name": "bought", "type": "int", "num_classes": 2},
}
ROWS = [  # as Python's csv module (and spreadsheets, pandas) write them: quoted only where needed
    {"age": "34", "visits": "3", "city": "New York, NY", "note": 'said "call me"', "bought": "1"},
    {"age": "", "visits": "", "city": "Boston", "note": "", "bought": "0"},
    {"age": "51.5", "visits": "7", "city": "Austin, TX", "note": "two\nlines", "bought": "1"},
]


def _write_csv(path, rows, opener=open, *, header=True):
  with opener(path, "wt", newline="") as f:
    writer = csv.DictWriter(f, fieldnames=list(rows[0]))
    if header:
      writer.writeheader()
    writer.writerows(rows)


def _staged(destination):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  files = sorted(tf.io.gfile.glob(f"{destination}/part-*.tfrecord"))
  rows = []
  for record in tf.data.TFRecordDataset(files):
    feature = tf.train.Example.FromString(record.numpy()).features.feature
    text = {name: feature[name].bytes_list.value[0].decode() for name in ("city", "note")}
    rows.append({"age": feature["age"].float_list.value[0], "visits": feature["visits"].int64_list.value[0],
                 **text, "bought": feature["bought"].int64_list.value[0]})
  return sorted(rows, key=lambda r: r["age"]), json.loads(tf.io.gfile.GFile(f"{destination}/schema.json").read())


@pytest.mark.parametrize("name,opener,header", [("plain.csv", open, True), ("packed.csv.gz", gzip.open, True),
                                                ("headerless.csv", open, False)])
def test_csv_with_strings_quotes_and_empty_cells(gcs, tmp_path, capsys, name, opener, header):
  _write_csv(tmp_path / name, ROWS, opener, header=header)
  (tmp_path / "schema.json").write_text(json.dumps(SCHEMA))
  destination = f"gs://test-bucket/staged/{name.split('.')[0]}"
  code = stage_data.main([f"--source={tmp_path}/{name}", f"--schema={tmp_path}/schema.json",
                          f"--destination={destination}", "--num_shards=2"])
  assert code == 0, capsys.readouterr().err
  assert json.loads(capsys.readouterr().out)["examples"] == 3
  rows, schema = _staged(destination)
  assert schema["features"][2]["vocabulary"] == ["Boston", "New York, NY"]
  assert rows == [  # without a header row, the fields are the schema's features and label in order, as training reads
      {"age": 34.0, "visits": 3, "city": "New York, NY", "note": 'said "call me"', "bought": 1},
      {"age": 35.0, "visits": 1, "city": "Boston", "note": "", "bought": 0},  # empty: each column's default
      {"age": 51.5, "visits": 7, "city": "Austin, TX", "note": "two\nlines", "bought": 1},
  ]


def test_gzip_tfrecord_is_restaged_uncompressed(gcs, churn_data, tmp_path, capsys):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  source = f"{churn_data}/train/part-00000-of-00004.tfrecord"
  records = [r.numpy() for r in tf.data.TFRecordDataset(source)]
  with tf.io.TFRecordWriter(str(tmp_path / "part.tfrecord.gz"), options="GZIP") as writer:  # as Beam writes
    for record in records:
      writer.write(record)
  code = stage_data.main([f"--source={tmp_path}/part.tfrecord.gz", f"--schema={churn_data}/train/schema.json",
                          "--destination=gs://test-bucket/staged/gz", "--num_shards=1"])
  assert code == 0, capsys.readouterr().err
  staged = [r.numpy() for r in tf.data.TFRecordDataset(tf.io.gfile.glob("gs://test-bucket/staged/gz/part-*"))]
  assert staged == records


def test_bad_input_is_one_line_and_exit_2(gcs, tmp_path, capsys):
  (tmp_path / "schema.json").write_text(json.dumps(SCHEMA))
  _write_csv(tmp_path / "no_label.csv", [{**ROWS[0], "bought": ""}])
  _write_csv(tmp_path / "no_city_value.csv", [{**ROWS[0], "city": ""}])
  _write_csv(tmp_path / "text_age.csv", [ROWS[0], {**ROWS[1], "age": "forty"}])
  _write_csv(tmp_path / "half_visit.csv", [{**ROWS[0], "visits": "1.5"}])
  _write_csv(tmp_path / "no_city.csv", [{k: v for k, v in ROWS[0].items() if k != "city"}])
  (tmp_path / "short.csv").write_text("age,visits,city,note,bought\n34,3\n")
  (tmp_path / "junk.tfrecord").write_bytes(b"this is not a TFRecord file at all")
  (tmp_path / "bad_schema.json").write_text("{")
  schema = f"--schema={tmp_path}/schema.json"
  cases = [  # the trainer's own words for each record (preflight.record_problem), naming --source
      ([f"--source={tmp_path}/no_label.csv", schema], r"no_label.csv line 2: column 'bought' is empty$"),
      ([f"--source={tmp_path}/no_city_value.csv", schema],
       r"no_city_value.csv line 2: column 'city' is empty and the schema gives it no default$"),
      ([f"--source={tmp_path}/text_age.csv", schema],
       r"text_age.csv line 3: column 'age' holds 'forty', but the schema says float$"),
      ([f"--source={tmp_path}/half_visit.csv", schema],
       r"half_visit.csv line 2: column 'visits' holds '1.5', but the schema says int, which a tf.train.Example "
       r"holds as a whole number"),
      ([f"--source={tmp_path}/no_city.csv", schema],
       r"^error: --source: the CSV columns \(age, visits, note, bought\) lack city named in the schema$"),
      ([f"--source={tmp_path}/short.csv", schema], r"short.csv line 2: the row has 2 fields, the CSV 5 columns$"),
      ([f"--source={tmp_path}/junk.tfrecord", schema], r"junk.tfrecord is not a readable TFRecord file"),
      ([f"--source={tmp_path}/none-*.csv", schema], r"^error: --source: no files match"),
      ([f"--source={tmp_path}/no_label.csv", f"--schema={tmp_path}/bad_schema.json"],
       r"^error: --schema: .*bad_schema.json is not valid JSON"),
      ([f"--source={tmp_path}/no_label.csv", schema, "--num_shards=0"], r"^error: --num_shards must be >= 1, got 0"),
  ]
  for args, message in cases:
    code = stage_data.main(args + ["--destination=gs://test-bucket/staged/bad"])
    err = capsys.readouterr().err
    assert code == 2 and re.search(message, err, re.M) and len(err.strip().splitlines()) == 1, (args, err)
  assert stage_data.main([f"--source={tmp_path}/no_label.csv", schema, "--destination=/local/dir"]) == 2
  assert "--destination must be gs://BUCKET/PREFIX, got '/local/dir'" in capsys.readouterr().err
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  assert not tf.io.gfile.glob("gs://test-bucket/staged/bad/*")  # nothing uploaded for a failed staging


# ----- the trainer's reader: iris as pandas writes it ----------------------------------------------------------

GAPPY = "sepal width (cm)"  # iris_frame leaves every 17th value out (NaN), as a user's data has gaps
IRIS_SCHEMA = {
    "features": [
        {"name": "sepal length (cm)", "type": "float"},
        {"name": GAPPY, "type": "float", "mean": 3.06, "std": 0.43, "default": 2.5},  # the default, not the mean
        {"name": "petal length (cm)", "type": "float"},
        {"name": "petal width (cm)", "type": "float"},
    ],
    "label": {"name": "species", "type": "string", "vocabulary": ["setosa", "versicolor", "virginica"]},
}


def _write_frame(frame, path, data_format, **csv_options):
  if data_format == "csv":
    frame.to_csv(path, index=False, **csv_options)
  elif data_format == "jsonl":
    frame.to_json(path, orient="records", lines=True)
  else:
    frame.to_parquet(path, index=False)


def _stage(tmp_path, path, destination, schema=None):
  schema_path = tmp_path / "iris_schema.json"
  schema_path.write_text(json.dumps(schema or IRIS_SCHEMA))
  return stage_data.main([f"--source={path}", f"--schema={schema_path}", f"--destination={destination}",
                          "--num_shards=1"])


def _trainer_source(path, schema):
  """The source pre-flight settles for a --train_data of `path`."""
  source = formats.resolve([path], requested="auto", vertex_format=None, flag="--train_data")
  return formats.settle(source, path, schema, flag="--train_data")


def _trainer_reads(files, schema, source):
  """Every record as the trainer's input pipeline parses and encodes it: one ordered evaluation pass."""
  fn = input_pipeline.make_dataset_fn(files, schema, source=source, global_batch_size=1000, training=False,
                                      repeat=False)
  batches = list(fn(None))
  assert len(batches) == 1
  features, labels = batches[0]
  return {name: values.numpy() for name, values in features.items()}, labels.numpy()


def _trainer_error(path, schema):
  """The one line a training run gives when its input pipeline fails on `path` (`data_errors` names the record)."""
  from trainer.planning import data_errors  # pylint: disable=g-import-not-at-top

  inputs = preflight.Inputs(schema=schema, train_files=[path], eval_files=[],
                            sources={"train": _trainer_source(path, schema)})
  with pytest.raises(UserError) as raised, data_errors.translated(inputs):
    _trainer_reads([path], schema, inputs.sources["train"])
  return str(raised.value)


def _nothing_at(destination):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  return not tf.io.gfile.glob(f"{destination}/*")


@pytest.mark.parametrize("data_format", ["csv", "jsonl", "parquet"])
def test_a_missing_value_takes_the_schema_default_the_trainer_gives_it(gcs, tmp_path, capsys, data_format):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  frame = iris_frame()
  gaps = [int(i) for i in frame.index[frame[GAPPY].isna()]]
  path = str(tmp_path / f"iris.{data_format}")
  _write_frame(frame, path, data_format)  # CSV: an empty cell; JSONL: null; Parquet: a null
  if data_format == "csv":
    with open(path) as f:
      assert f.read().splitlines()[gaps[1] + 1].split(",")[1] == ""
  destination = f"gs://test-bucket/staged/iris-{data_format}"
  assert _stage(tmp_path, path, destination) == 0, capsys.readouterr().err
  assert json.loads(capsys.readouterr().out)["examples"] == len(frame)

  staged_files = tf.io.gfile.glob(f"{destination}/part-*.tfrecord")
  staged = [tf.train.Example.FromString(r) for r in tf.data.TFRecordDataset(staged_files).as_numpy_iterator()]
  assert [list(staged[i].features.feature[GAPPY].float_list.value) for i in gaps] == [[2.5]] * len(gaps)

  schema = schema_lib.parse_schema(IRIS_SCHEMA, source="iris_schema.json")
  column = schema.feature(GAPPY).input_name
  direct_features, direct_labels = _trainer_reads([path], schema, _trainer_source(path, schema))
  assert direct_features[column][gaps].tolist() == [2.5] * len(gaps)  # the trainer on the file itself
  staged_features, staged_labels = _trainer_reads(staged_files, schema, formats.TFRECORD)
  assert staged_features.keys() == direct_features.keys()
  for name, values in direct_features.items():  # every value of every row, exactly
    np.testing.assert_array_equal(staged_features[name], values, err_msg=name)
  np.testing.assert_array_equal(staged_labels, direct_labels)


@pytest.mark.parametrize("bad,column,row,instead", [
    ("nan", GAPPY, 100, "leave the value out for the schema's default"),
    ("inf", "petal length (cm)", 120, "remove the record or give the column a value"),
])
def test_nan_and_inf_are_refused_as_the_trainer_refuses_them(gcs, tmp_path, capsys, bad, column, row, instead):
  frame = iris_frame()
  if bad == "nan":
    frame[GAPPY] = frame[GAPPY].fillna(3.0)
    frame.loc[row, column] = np.nan
    options = {"na_rep": "nan"}  # as numpy.savetxt and na_rep="nan" write a missing float
  else:
    frame.loc[row, column] = np.inf  # pandas writes "inf"; the gaps stay empty cells, which take the default
    options = {}
  path = str(tmp_path / "iris.csv")
  _write_frame(frame, path, "csv", **options)
  with open(path) as f:
    assert bad in f.read().splitlines()[row + 1].split(",")
  destination = f"gs://test-bucket/staged/iris-{bad}"
  assert _stage(tmp_path, path, destination) == 2
  err = capsys.readouterr().err
  assert err.splitlines() == [f"error: --source: {path} line {row + 2}: column {column!r} holds {bad!r}, a NaN or "
                              f"infinite number; {instead}"], err
  schema = schema_lib.parse_schema(IRIS_SCHEMA, source="iris_schema.json")
  assert "error: " + _trainer_error(path, schema).replace("--train_data:", "--source:", 1) == err.strip()
  assert _nothing_at(destination)


def test_an_empty_cell_without_a_default_is_refused_as_the_trainer_refuses_it(gcs, tmp_path, capsys):
  schema_value = json.loads(json.dumps(IRIS_SCHEMA))
  del schema_value["features"][1]["default"]
  frame = iris_frame()
  frame[GAPPY] = frame[GAPPY].fillna(3.0)
  frame.loc[50, GAPPY] = np.nan
  path = str(tmp_path / "iris.csv")
  _write_frame(frame, path, "csv")
  destination = "gs://test-bucket/staged/iris-no-default"
  assert _stage(tmp_path, path, destination, schema_value) == 2
  err = capsys.readouterr().err
  assert err.splitlines() == [f"error: --source: {path} line 52: column {GAPPY!r} is empty and the schema gives it "
                              "no default"], err
  schema = schema_lib.parse_schema(schema_value, source="iris_schema.json")
  assert "error: " + _trainer_error(path, schema).replace("--train_data:", "--source:", 1) == err.strip()
  assert _nothing_at(destination)


def test_label_infers_the_schema_the_trainer_infers(gcs, tmp_path, capsys):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  from trainer.data import inference as schema_inference  # pylint: disable=g-import-not-at-top

  frame = iris_frame()
  path, headerless = str(tmp_path / "iris.csv"), str(tmp_path / "headerless.csv")
  frame.to_csv(path, index=False)
  frame.to_csv(headerless, index=False, header=False)
  destination = "gs://test-bucket/staged/iris-inferred"
  assert stage_data.main([f"--source={path}", "--label=species", f"--destination={destination}"]) == 0, (
      capsys.readouterr().err)
  inferred = schema_inference.infer_schema([path], _trainer_source(path, None),
                                           schema_inference.InferenceConfig(label="species"), flag="--train_data",
                                           log=lambda _: None)
  assert json.loads(tf.io.gfile.GFile(f"{destination}/schema.json").read()) == inferred.to_dict()
  capsys.readouterr()
  assert stage_data.main([f"--source={headerless}", "--label=species",
                          "--destination=gs://test-bucket/staged/iris-headerless"]) == 2
  err = capsys.readouterr().err
  assert err.splitlines() == [f"error: --source: {headerless} has no header row, so --label cannot name a column; "
                              "pass --schema (its 'columns' name every field; without them its features and label "
                              "are the fields in order)"], err
  assert _nothing_at("gs://test-bucket/staged/iris-headerless")
