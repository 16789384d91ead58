"""scripts/stage_data.py on files as other tools write them: CSV with string columns, quoted commas and quotes,
empty cells, gzip; gzip TFRecord; and bad input as one line with exit code 2."""

import csv
import gzip
import json
import re

import pytest

from scripts import stage_data

SCHEMA = {
    "features": [
        {"name": "age", "type": "float", "mean": 40.0, "std": 12.0},
        {"name": "visits", "type": "int"},
        {"name": "city", "type": "string", "vocabulary": ["Boston", "New York, NY"]},
        {"name": "note", "type": "string", "vocabulary": ["vip"]},
    ],
    "label": {"name": "bought", "type": "int", "num_classes": 2},
}
ROWS = [  # as Python's csv module (and spreadsheets, pandas) write them: quoted only where needed
    {"age": "34", "visits": "3", "city": "New York, NY", "note": 'said "call me"', "bought": "1"},
    {"age": "", "visits": "", "city": "Boston", "note": "", "bought": "0"},
    {"age": "51.5", "visits": "7", "city": "Austin, TX", "note": "two\nlines", "bought": "1"},
]


def _write_csv(path, rows, opener=open):
  with opener(path, "wt", newline="") as f:
    writer = csv.DictWriter(f, fieldnames=list(rows[0]))
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


@pytest.mark.parametrize("name,opener", [("plain.csv", open), ("packed.csv.gz", gzip.open)])
def test_csv_with_strings_quotes_and_empty_cells(gcs, tmp_path, capsys, name, opener):
  _write_csv(tmp_path / name, ROWS, opener)
  (tmp_path / "schema.json").write_text(json.dumps(SCHEMA))
  destination = f"gs://test-bucket/staged/{name.split('.')[0]}"
  code = stage_data.main([f"--source={tmp_path}/{name}", f"--schema={tmp_path}/schema.json",
                          f"--destination={destination}", "--num_shards=2"])
  assert code == 0, capsys.readouterr().err
  assert json.loads(capsys.readouterr().out)["examples"] == 3
  rows, schema = _staged(destination)
  assert schema["features"][2]["vocabulary"] == ["Boston", "New York, NY"]
  assert rows == [
      {"age": 34.0, "visits": 3, "city": "New York, NY", "note": 'said "call me"', "bought": 1},
      {"age": 40.0, "visits": 0, "city": "Boston", "note": "", "bought": 0},  # empty: the mean, 0, ""
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
  _write_csv(tmp_path / "text_age.csv", [ROWS[0], {**ROWS[1], "age": "forty"}])
  _write_csv(tmp_path / "no_city.csv", [{k: v for k, v in ROWS[0].items() if k != "city"}])
  (tmp_path / "short.csv").write_text("age,visits,city,note,bought\n34,3\n")
  (tmp_path / "junk.tfrecord").write_bytes(b"this is not a TFRecord file at all")
  (tmp_path / "bad_schema.json").write_text("{")
  schema = f"--schema={tmp_path}/schema.json"
  cases = [
      ([f"--source={tmp_path}/no_label.csv", schema], r"no_label.csv line 2: the label 'bought' is empty"),
      ([f"--source={tmp_path}/text_age.csv", schema],
       r"text_age.csv line 3: column 'age' holds 'forty', but the schema says float$"),
      ([f"--source={tmp_path}/no_city.csv", schema], r"no_city.csv line 2: no column 'city' \(the header has: "),
      ([f"--source={tmp_path}/short.csv", schema], r"short.csv line 2: the row has fewer fields than the header"),
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
