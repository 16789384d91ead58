"""Data as other tools write it: formats and compressions resolved, schemas inferred, every reader agreeing.

The data is public data a package ships (scikit-learn's iris and digits), written by pandas, Pillow and
TensorFlow's own writers the way users' pipelines write it, not by this project's generator.
"""

from __future__ import annotations

import base64
import dataclasses
import gzip
import io
import json
import os
import zlib

import numpy as np
import pandas as pd
import pytest
import tensorflow as tf
from PIL import Image
from sklearn import datasets as sk_datasets

from trainer.core.errors import UserError
from trainer.data import feature_kinds
from trainer.data import features as features_lib
from trainer.data import formats
from trainer.data import inference as schema_inference
from trainer.data import input_pipeline
from trainer.data import schema as schema_lib
from trainer.planning import preflight
from scripts.public_data import iris_frame
from scripts.public_data import png as _png

# The quick tier (scripts/test.sh --quick): no test here trains for long or waits on peers.
pytestmark = pytest.mark.quick

SKLEARN_DATA = os.path.join(os.path.dirname(sk_datasets.__file__), "data")


def write_tfrecord(path: str, frame: pd.DataFrame, compression: str = "") -> None:
  with tf.io.TFRecordWriter(path, tf.io.TFRecordOptions(compression_type=compression)) as writer:
    for row in frame.to_dict("records"):
      feature = {}
      for name, value in row.items():
        if isinstance(value, str):
          feature[name] = tf.train.Feature(bytes_list=tf.train.BytesList(value=[value.encode()]))
        elif not np.isnan(value):  # a missing value is an absent feature, as Beam's converters write it
          feature[name] = tf.train.Feature(float_list=tf.train.FloatList(value=[value]))
      writer.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())


@pytest.fixture(scope="module")
def iris_files(tmp_path_factory):
  """The same 150 iris rows in every format and compression the trainer reads."""
  directory = tmp_path_factory.mktemp("iris")
  frame = iris_frame()
  paths = {
      "csv": directory / "iris.csv", "csv_gz": directory / "iris.csv.gz", "jsonl": directory / "iris.jsonl",
      "jsonl_gz": directory / "iris.jsonl.gz", "tfrecord_gz": directory / "iris.tfrecord.gz",
      "tfrecord_zlib": directory / "part-0", "csv_no_header": directory / "noheader.csv",
  }
  frame.to_csv(paths["csv"], index=False)
  frame.to_csv(paths["csv_gz"], index=False, compression="gzip")
  frame.to_csv(paths["csv_no_header"], index=False, header=False)
  frame.to_json(paths["jsonl"], orient="records", lines=True)
  frame.to_json(paths["jsonl_gz"], orient="records", lines=True, compression="gzip")
  write_tfrecord(str(paths["tfrecord_gz"]), frame, "GZIP")
  write_tfrecord(str(paths["tfrecord_zlib"]), frame, "ZLIB")  # no extension: found from the content
  return {name: str(path) for name, path in paths.items()}, frame


def _source(path: str, *, requested: str = "auto", columns=None) -> formats.Source:
  return formats.source_for([path], requested=requested, columns=columns, flag="--train_data")


@pytest.mark.parametrize("name,expected", [
    ("csv", formats.Source("csv", "", None, True)), ("csv_gz", formats.Source("csv", "GZIP", None, True)),
    ("jsonl", formats.Source("jsonl")), ("jsonl_gz", formats.Source("jsonl", "GZIP")),
    ("tfrecord_gz", formats.Source("tfrecord", "GZIP")), ("tfrecord_zlib", formats.Source("tfrecord", "ZLIB")),
    ("csv_no_header", formats.Source("csv", "", None, False)),
])
def test_format_and_compression_are_found(iris_files, name, expected):
  files, frame = iris_files
  source = _source(files[name])
  assert (source.format, source.compression, source.header) == (expected.format, expected.compression,
                                                                 expected.header)
  if name == "csv_no_header":
    assert source.columns == tuple(f"column_{i}" for i in range(5))
  elif source.format == "csv":
    assert source.columns == tuple(frame.columns)


def test_vertex_data_format_wins_over_the_extension(tmp_path):
  path = tmp_path / "training-00000-of-00001"  # Vertex's export names carry no extension
  path.write_text('{"x": 1, "y": 0}\n')
  assert formats.resolve([str(path)], requested="auto", vertex_format="jsonl", flag="f").format == "jsonl"
  assert formats.resolve([str(path)], requested="auto", vertex_format=None, flag="f").format == "jsonl"
  assert formats.resolve([str(path)], requested="csv", vertex_format="jsonl", flag="f").format == "csv"


def test_headerless_gzip_csv_from_scikit_learn():
  """digits.csv.gz as scikit-learn ships it: gzip, no header, 64 pixel columns and the digit."""
  path = os.path.join(SKLEARN_DATA, "digits.csv.gz")
  source = _source(path)
  assert (source.format, source.compression, source.header, len(source.columns)) == ("csv", "GZIP", False, 65)
  schema = schema_inference.infer_schema([path], source, schema_inference.InferenceConfig(label="column_64"),
                                         flag="--train_data", log=lambda _: None)
  assert schema.label.num_classes == 10 and schema.task == "classification"
  # Pixel columns that are always 0 carry nothing and are left out; the rest are standardized numbers.
  assert 55 <= len(schema.features) < 64 and all(f.type == "float" and f.std > 0 for f in schema.features)
  named = _source(path, columns=tuple(f"p{i}" for i in range(64)) + ("digit",))
  assert not named.header and named.columns[-1] == "digit"
  with pytest.raises(UserError, match=r"^--train_data: .*digits.csv.gz has 65 fields per row and no header; 3 "
                                      r"column names were given \(a, b, c\)"):
    _source(path, columns=("a", "b", "c"))


def test_many_small_files_written_class_after_class_are_sampled_across_their_length(tmp_path):
  """scikit-learn's wine, one row per CSV file in its own order (class 0, then 1, then 2), as a newcomer staged it:
  the sample reads files spread over the whole sorted list, so every class is seen (it read the first 64 of 178
  files, found 2 classes of 3, and a later file's label was refused)."""
  wine = sk_datasets.load_wine(as_frame=True).frame.rename(columns={"target": "cultivar"})
  files = []
  for i, (_, row) in enumerate(wine.iterrows()):
    path = str(tmp_path / f"part-{i:04d}.csv")
    row.to_frame().T.astype({"cultivar": int}).to_csv(path, index=False)
    files.append(path)
  logged = []
  schema = schema_inference.infer_schema(files, _source(files[0]), schema_inference.InferenceConfig(label="cultivar"),
                                         flag="--train_data", log=logged.append)
  assert schema.label.num_classes == 3, logged
  assert logged[0].startswith("schema inference: 64 records sampled from 64 of 178 file(s) (CSV"), logged
  reading = schema_inference._reading_order(files)  # pylint: disable=protected-access
  assert reading[:16] == [files[i * 178 // 16] for i in range(16)] and len(reading) == len(set(reading)) == 64
  assert schema_inference._reading_order(files[:10]) == files[:10]  # pylint: disable=protected-access  (few: all)


def test_inferred_iris_schema(iris_files):
  files, frame = iris_files
  logged = []
  schema = schema_inference.infer_schema([files["csv"]], _source(files["csv"]),
                                         schema_inference.InferenceConfig(label="species"), flag="--train_data",
                                         log=logged.append)
  assert schema.label == schema_lib.Label("species", "string", 3, ("setosa", "versicolor", "virginica"))
  widths = schema.feature("sepal width (cm)")
  observed = frame["sepal width (cm)"].dropna()
  assert widths.mean == pytest.approx(observed.mean(), abs=1e-5)
  assert widths.std == pytest.approx(observed.std(ddof=0), abs=1e-5)
  assert widths.default == pytest.approx(observed.mean(), abs=1e-5)
  assert widths.input_name == "sepal_width__cm_"
  assert any("'sepal width (cm)' has 9 missing value(s)" in line for line in logged)
  # Deterministic: what every worker of a job infers from the same files.
  again = schema_inference.infer_schema([files["csv"]], _source(files["csv"]),
                                        schema_inference.InferenceConfig(label="species"), flag="f",
                                        log=lambda _: None)
  assert again == schema
  # The other formats infer the same schema (TFRecord keeps the Example's float type).
  for name in ("csv_gz", "jsonl", "jsonl_gz", "tfrecord_gz"):
    other = schema_inference.infer_schema([files[name]], _source(files[name]),
                                          schema_inference.InferenceConfig(label="species"), flag="f",
                                          log=lambda _: None)
    by_name = lambda s: {f.name: _rounded(dataclasses.replace(f).__dict__) for f in s.features}  # noqa: E731
    assert by_name(other) == by_name(schema) and other.label == schema.label, name
  # The written file reads back as the same schema.
  assert schema_lib.parse_schema(json.loads(json.dumps(schema.to_dict())), source="x") == schema


def _rounded(value):
  """Numbers to 4 decimals: TFRecord holds float32, so its means differ from the CSV's in the 7th digit."""
  if isinstance(value, dict):
    return {k: _rounded(v) for k, v in value.items()}
  if isinstance(value, list):
    return [_rounded(v) for v in value]
  return round(value, 4) if isinstance(value, float) else value


def _read_all(path: str, schema: schema_lib.Schema, source: formats.Source):
  fn = input_pipeline.make_dataset_fn([path], schema, source=source, global_batch_size=200, training=False,
                                      repeat=False)
  features, labels = next(iter(fn(None)))
  return {k: v.numpy() for k, v in features.items()}, labels.numpy()


def test_every_format_reads_the_same_examples(iris_files):
  files, frame = iris_files
  schema = schema_inference.infer_schema([files["csv"]], _source(files["csv"]),
                                         schema_inference.InferenceConfig(label="species"), flag="f",
                                         log=lambda _: None)
  expected_labels = frame["species"].map({"setosa": 0, "versicolor": 1, "virginica": 2}).to_numpy()
  widths = frame["sepal width (cm)"].fillna(schema.feature("sepal width (cm)").default).to_numpy(np.float32)
  for name in ("csv", "csv_gz", "jsonl", "jsonl_gz", "tfrecord_gz", "tfrecord_zlib"):
    features, labels = _read_all(files[name], schema, _source(files[name]))
    np.testing.assert_array_equal(labels, expected_labels, err_msg=name)
    np.testing.assert_allclose(features["sepal_width__cm_"], widths, rtol=1e-6, err_msg=name)
    np.testing.assert_allclose(features["petal_length__cm_"], frame["petal length (cm)"], rtol=1e-6, err_msg=name)
  # A headerless file reads in the schema's column order.
  headerless = dataclasses.replace(_source(files["csv_no_header"]), columns=schema.columns)
  features, labels = _read_all(files["csv_no_header"], schema, headerless)
  np.testing.assert_array_equal(labels, expected_labels)


def test_jsonl_strings_arrays_booleans_and_escapes(tmp_path):
  """What json.dumps writes: escaped quotes and slashes, true/false, nulls, arrays of N numbers."""
  rows = [{"city": 'the "big" one', "path": "a/b", "flag": True, "v": [1, 2.5, -3e-1], "y": 1.5},
          {"city": "plain", "path": "c\\d", "flag": False, "v": [0, 0, 1], "y": -2, "extra": {"nested": [1]}},
          {"path": "e", "flag": None, "v": None, "y": 0}]
  path = tmp_path / "rows.jsonl"
  path.write_text("".join(json.dumps(row) + "\n" for row in rows))
  schema = schema_lib.parse_schema({"features": [
      {"name": "city", "type": "string", "vocabulary": ['the "big" one', "plain"], "default": "plain"},
      {"name": "path", "type": "string", "vocabulary": ["a/b", "c\\d", "e"]},
      {"name": "flag", "type": "float", "default": -1},
      {"name": "v", "type": "float", "shape": [3], "default": 9}], "label": {"name": "y", "type": "float"}},
      source="t")
  features, labels = _read_all(str(path), schema, formats.Source("jsonl"))
  np.testing.assert_array_equal(features["city"], [1, 2, 2])
  np.testing.assert_array_equal(features["path"], [1, 2, 3])
  np.testing.assert_array_equal(features["flag"], [1, 0, -1])
  np.testing.assert_allclose(features["v"], [[1, 2.5, -0.3], [0, 0, 1], [9, 9, 9]], rtol=1e-6)
  np.testing.assert_allclose(labels, [1.5, -2, 0])


def _annotations(*names, **labels):
  return [{"displayName": name, "annotationResourceLabels": {
      "aiplatform.googleapis.com/annotation_set_name": "displayName", **labels}} for name in names]


def test_multi_label_annotations_and_arrays_read_as_multi_hot(tmp_path):
  """Vertex's multi-label export as json.dumps writes it (and as UTF-8): nested annotation labels, a label value
  that is the word "displayName", quotes and non-ASCII in class names, no annotation at all; and a plain JSON
  array of names, read as schema inference finds them."""
  classes = ['say "hi"', "été", "x"]
  items = [(['say "hi"'], {"extra": "displayName"}), (["x", "été"], {}), ([], {}), (["été", "été"], {})]
  export = tmp_path / "export.jsonl"
  with open(export, "w", encoding="utf-8") as f:
    for i, (names, labels) in enumerate(items):
      line = {"v": i * 0.5, "classificationAnnotations": _annotations(*names, **labels),
              "dataItemResourceLabels": {"aiplatform.googleapis.com/ml_use": "training"}}
      f.write(json.dumps(line, ensure_ascii=i % 2 == 0) + "\n")
  expected = [[1, 0, 0], [0, 1, 1], [0, 0, 0], [0, 1, 0]]
  source = _source(str(export))
  assert formats.vertex_export_label(str(export), source, flag="f") == formats.VERTEX_MULTI_LABEL
  schema = schema_inference.infer_schema([str(export)], source, schema_inference.InferenceConfig(
      label=formats.VERTEX_MULTI_LABEL), flag="f", log=lambda _: None)
  assert (schema.task, schema.label.vocabulary) == ("multi_label", ("say \"hi\"", "x", "été"))
  assert [f.name for f in schema.features] == ["v"]  # not the annotation sets, nor ml_use
  schema = dataclasses.replace(schema, label=dataclasses.replace(schema.label, vocabulary=tuple(classes)))
  _, labels = _read_all(str(export), schema, source)
  np.testing.assert_array_equal(labels, expected)

  tags = tmp_path / "tags.jsonl"
  tags.write_text("".join(json.dumps({"v": i, "tags": names}) + "\n" for i, (names, _) in enumerate(items)))
  schema = schema_inference.infer_schema([str(tags)], _source(str(tags)), schema_inference.InferenceConfig(
      label="tags"), flag="f", log=lambda _: None)
  assert schema.label.multi_label
  schema = dataclasses.replace(schema, label=dataclasses.replace(schema.label, vocabulary=tuple(classes)))
  _, labels = _read_all(str(tags), schema, _source(str(tags)))
  np.testing.assert_array_equal(labels, expected)


def test_one_export_of_every_split_infers_from_its_training_lines_only(tmp_path):
  """A class that only test lines name must not reach the schema (nor their values the statistics)."""
  export = tmp_path / "export.jsonl"
  with open(export, "w") as f:
    for i in range(40):
      use = "test" if i % 4 == 0 else "training"
      f.write(json.dumps({"v": float(i), "classificationAnnotation": {"displayName": "secret" if use == "test" else
                                                                       ("a", "b")[i % 2]},
                          "dataItemResourceLabels": {"aiplatform.googleapis.com/ml_use": use}}) + "\n")
  source = dataclasses.replace(_source(str(export)), ml_use="training")
  assert formats.count_ml_use([str(export)], _source(str(export)), flag="f") == {
      "training": 30, "validation": 0, "test": 10, "": 0}
  schema = schema_inference.infer_schema([str(export)], source, schema_inference.InferenceConfig(
      label=formats.VERTEX_LABEL), flag="f", log=lambda _: None)
  assert schema.label.vocabulary == ("a", "b")
  _, labels = _read_all(str(export), schema, source)
  assert len(labels) == 30


def test_image_folders_leave_stray_files_out():
  images = [f"gs://b/train/{c}/{i}.png" for c in "ab" for i in range(10)]
  assert formats.image_folder_files(images + ["gs://b/train/labels.csv"]) == (images, ["gs://b/train/labels.csv"])
  assert formats.image_folder_files(images[:5] + ["gs://b/data.csv"]) == (images[:5] + ["gs://b/data.csv"], [])


def test_multi_label_records_that_do_not_fit_are_named():
  schema = schema_lib.parse_schema({"features": [{"name": "t", "type": "float"}], "label": {
      "name": formats.VERTEX_MULTI_LABEL, "type": "string", "vocabulary": ["a", "b"], "multi_label": True}},
      source="t")
  source = formats.Source("jsonl")
  assert preflight.record_problem({"t": 1.0, formats.VERTEX_MULTI_LABEL: ["a"]}, schema, source) is None
  assert "without classificationAnnotations" in preflight.record_problem({"t": 1.0}, schema, source)
  assert "holds 'c', not one of the schema's classes" in preflight.record_problem(
      {"t": 1.0, formats.VERTEX_MULTI_LABEL: ["a", "c"]}, schema, source)
  with pytest.raises(UserError, match="multi-label .* read from JSONL"):
    formats.check_schema(schema, formats.Source("csv", columns=("t", formats.VERTEX_MULTI_LABEL)),
                                         ["x.csv"], flag="--train_data")
  with pytest.raises(UserError, match="multi_label 'yes'"):
    schema_lib.parse_schema({"features": [{"name": "t", "type": "float"}], "label": {
        "name": "y", "type": "string", "vocabulary": ["a", "b"], "multi_label": "yes"}}, source="t")


@pytest.mark.parametrize("compression", [None, "gzip"])
def test_csv_quoted_fields_with_line_breaks_read_whole(tmp_path, compression):
  """Free text as pandas writes it to CSV: a field with a line break (LF or CRLF), comma or quote is quoted and
  the break written as is. Pre-flight sees the break in the file's head and reads it with CsvDataset, which
  follows the quotes; every record then reads as pandas reads it back."""
  frame = iris_frame()
  notes = ["fine", "two\nlines", "windows\r\nbreak", 'a "quoted", comma', "trailing break\n"]
  frame["note"] = [notes[i % len(notes)] for i in range(len(frame))]
  path = str(tmp_path / ("notes.csv.gz" if compression else "notes.csv"))
  frame.to_csv(path, index=False, compression=compression)
  source = _source(path)
  assert source.multiline and source.header and "quoted line breaks" in source.describe()
  schema = schema_inference.infer_schema([path], source, schema_inference.InferenceConfig(label="species"),
                                         flag="f", log=lambda _: None)
  vocabulary = schema.feature("note").vocabulary
  assert sorted(vocabulary) == sorted(notes)
  features, labels = _read_all(path, schema, source)
  read_back = pd.read_csv(path)
  assert len(labels) == len(read_back) == 150
  np.testing.assert_array_equal(features["note"], [vocabulary.index(n) + 1 for n in read_back["note"]])
  np.testing.assert_array_equal(labels, read_back["species"].map({"setosa": 0, "versicolor": 1,
                                                                    "virginica": 2}))
  np.testing.assert_allclose(features["petal_length__cm_"], read_back["petal length (cm)"], rtol=1e-6)
  # A file without a break reads line by line (the faster reader), unless --csv_multiline asks for CsvDataset.
  plain = str(tmp_path / "plain.csv")
  frame.assign(note="fine").to_csv(plain, index=False)
  assert not _source(plain).multiline
  forced = formats.csv_source(formats.Source("csv"), plain, columns=None, flag="f", multiline=True)
  features, labels = _read_all(plain, schema, forced)
  assert len(labels) == 150 and set(features["note"]) == {vocabulary.index("fine") + 1}


@pytest.mark.parametrize("writer", ["pandas", "json.dumps", "utf-8"])
def test_jsonl_unicode_and_control_escapes_read_as_json_loads_reads_them(tmp_path, writer):
  """pandas' to_json and json.dumps escape every non-ASCII character (\\u00e3, a surrogate pair for an emoji)
  and control characters (\\n, \\t): the pipeline reads the same strings as json.loads and schema inference,
  or their vocabulary ids would not match (train/serve skew on every accented category)."""
  cities = ["São Paulo", "Zürich", "東京", "smile 😀", "tab\there", "two\nlines", "a \\u00e9 literal",
            'quote " and \\ slash', "plain"]
  frame = pd.DataFrame({"città": cities * 3, "y": np.arange(len(cities) * 3, dtype=np.float64)})
  path = tmp_path / "rows.jsonl"
  if writer == "pandas":
    frame.to_json(path, orient="records", lines=True)  # force_ascii=True: pandas' default
  else:
    ensure_ascii = writer == "json.dumps"
    path.write_text("".join(json.dumps(row, ensure_ascii=ensure_ascii) + "\n" for row in frame.to_dict("records")),
                    encoding="utf-8")
  text = path.read_text(encoding="utf-8")
  assert ("\\u00e3" in text) == (writer != "utf-8") and ("São" in text) == (writer == "utf-8")
  schema = schema_inference.infer_schema([str(path)], _source(str(path)),
                                         schema_inference.InferenceConfig(label="y"), flag="f",
                                         log=lambda _: None)
  vocabulary = schema.feature("città").vocabulary
  assert sorted(vocabulary) == sorted(cities)
  features, labels = _read_all(str(path), schema, _source(str(path)))
  expected = [vocabulary.index(city) + 1 for city in frame["città"]]  # id 0 is out of vocabulary
  np.testing.assert_array_equal(features[schema.feature("città").input_name], expected)
  np.testing.assert_allclose(labels, frame["y"])


def _digits():
  digits = sk_datasets.load_digits()
  return digits.images.astype(np.uint8), digits.target


def _jpeg(pixels: np.ndarray) -> bytes:
  buffer = io.BytesIO()
  Image.fromarray(pixels).convert("RGB").save(buffer, format="JPEG", quality=95)
  return buffer.getvalue()


def test_images_png_jpeg_and_raw_are_decoded_and_scaled_from_the_data(tmp_path):
  images, labels = _digits()
  images, labels = images[:64], labels[:64]
  scaled = images * 15  # 0..240, as an 8-bit image file holds them
  raw_path, png_path, jpeg_path = (str(tmp_path / n) for n in ("raw.tfrecord", "png.tfrecord.gz", "jpeg.jsonl"))
  with tf.io.TFRecordWriter(raw_path) as raw, tf.io.TFRecordWriter(
      png_path, tf.io.TFRecordOptions(compression_type="GZIP")) as png:
    for pixels, label in zip(images, labels):
      for writer, data in ((raw, pixels.tobytes()), (png, _png(pixels * 15))):
        writer.write(tf.train.Example(features=tf.train.Features(feature={
            "image": tf.train.Feature(bytes_list=tf.train.BytesList(value=[data])),
            "digit": tf.train.Feature(int64_list=tf.train.Int64List(value=[int(label)]))})).SerializeToString())
  with open(jpeg_path, "w") as f:
    for pixels, label in zip(images, labels):
      big = np.kron(pixels * 15, np.ones((2, 2), np.uint8))  # 16x16: resized to the schema's 8x8 in the pipeline
      f.write(json.dumps({"image": {"b64": base64.b64encode(_jpeg(big)).decode()}, "digit": f"d{label}"}) + "\n")
  inferred = {}
  for name, path in (("raw", raw_path), ("png", png_path), ("jpeg", jpeg_path)):
    source = _source(path)
    inferred[name] = schema_inference.infer_schema([path], source, schema_inference.InferenceConfig(label="digit"),
                                                   flag="f", log=lambda _: None)
  raw_image = inferred["raw"].feature("image")
  # Raw uint8 pixels 0..16 (scikit-learn's digits): the scale comes from the data, not a constant 255.
  assert (raw_image.shape, raw_image.encoding, raw_image.max_value) == ((8, 8, 1), "raw", 16.0)
  png_image = inferred["png"].feature("image")
  assert (png_image.shape, png_image.encoding, png_image.max_value) == ((8, 8, 1), "png", 255.0)
  jpeg_image = inferred["jpeg"].feature("image")
  assert (jpeg_image.shape, jpeg_image.encoding) == ((16, 16, 3), "jpeg")
  assert inferred["jpeg"].label.vocabulary == tuple(f"d{i}" for i in range(10))

  features, got = _read_all(raw_path, inferred["raw"], _source(raw_path))
  np.testing.assert_array_equal(features["image"][..., 0], images)
  np.testing.assert_array_equal(got, labels)
  features, _ = _read_all(png_path, inferred["png"], _source(png_path))
  np.testing.assert_array_equal(features["image"][..., 0], scaled)  # PNG is lossless
  # JPEG at 16x16 into a schema of 8x8 RGB: decoded, resized, close to the pixels.
  small = schema_lib.parse_schema({**inferred["jpeg"].to_dict(), "features": [
      {"name": "image", "type": "image", "shape": [8, 8, 3], "encoding": "jpeg"}]}, source="t")
  features, _ = _read_all(jpeg_path, small, _source(jpeg_path))
  assert features["image"].shape == (64, 8, 8, 3)
  assert np.abs(features["image"][..., 0] - scaled).mean() < 12


def test_image_uris_in_tfrecord_are_read_from_their_files(tmp_path):
  """Paths in a bytes_list, as a Beam or TFX job that keeps images in the bucket writes them."""
  images, labels = _digits()
  images, labels = images[:48], labels[:48]
  path = str(tmp_path / "refs.tfrecord")
  with tf.io.TFRecordWriter(path) as writer:
    for i, (pixels, label) in enumerate(zip(images, labels)):
      image_path = tmp_path / f"{i}.png"
      image_path.write_bytes(_png(pixels * 15))
      writer.write(tf.train.Example(features=tf.train.Features(feature={
          "image_uri": tf.train.Feature(bytes_list=tf.train.BytesList(value=[str(image_path).encode()])),
          "digit": tf.train.Feature(int64_list=tf.train.Int64List(value=[int(label)]))})).SerializeToString())
  schema = schema_inference.infer_schema([path], _source(path), schema_inference.InferenceConfig(label="digit"),
                                         flag="f", log=lambda _: None)
  image = schema.feature("image_uri")
  assert (image.type, image.uri, image.shape, image.encoding) == ("image", True, (8, 8, 1), "png")
  features, got = _read_all(path, schema, _source(path))
  np.testing.assert_array_equal(features["image_uri"][..., 0], images * 15)
  np.testing.assert_array_equal(got, labels)


def test_tfx_schema_pbtxt(tmp_path):
  """A schema as TFDV's infer_schema / TFX SchemaGen writes it (text proto), with the label kept out of SERVING."""
  path = tmp_path / "schema.pbtxt"
  path.write_text('''
feature { name: "tenure_months" type: FLOAT presence { min_fraction: 1.0 } shape { dim { size: 1 } } }
feature { name: "support_calls" type: INT int_domain { min: 0 max: 12 } shape { dim { size: 1 } } }
feature { name: "plan" type: BYTES domain: "plan" presence { min_fraction: 1.0 } }
feature { name: "embedding" type: FLOAT shape { dim { size: 4 } } }
feature { name: "churned" type: INT int_domain { min: 0 max: 1 } not_in_environment: "SERVING" }
string_domain { name: "plan" value: "basic" value: "plus" value: "pro" }
default_environment: "TRAINING"
default_environment: "SERVING"
''')
  schema = schema_lib.load_schema(str(path))
  assert schema.label == schema_lib.Label("churned", "int", 2)
  assert schema.feature("plan").vocabulary == ("basic", "plus", "pro")
  assert schema.feature("support_calls").type == "int"
  assert schema.feature("embedding").shape == (4,)
  assert schema_lib.load_schema(str(path), label="tenure_months").task == "regression"
  path.write_text('feature { name: "x" type: BYTES }\nfeature { name: "y" type: FLOAT }\n')
  with pytest.raises(UserError, match=r"feature 'x' is BYTES without a string domain"):
    schema_lib.load_schema(str(path), label="y")
  with pytest.raises(UserError, match=r"pass --label to say which feature is the label"):
    schema_lib.load_schema(str(path))


@pytest.mark.parametrize("value,message", [
    ({"features": [{"name": "a", "type": "float", "shape": [0]}], "label": {"name": "y", "type": "float"}},
     r"numeric feature 'a' has shape \[0\]; expected \[N\]"),
    ({"features": [{"name": "a", "type": "float", "shape": [3], "mean": [1, 2]}], "label": {"name": "y",
                                                                                              "type": "float"}},
     r"feature 'a' has mean \[1, 2\]; expected a number or a list of 3"),
    ({"features": [{"name": "a", "type": "image", "shape": [8, 8, 2], "encoding": "png"}],
      "label": {"name": "y", "type": "float"}}, r"image feature 'a' is png with 2 channels; expected 1, 3 or 4"),
    ({"features": [{"name": "a", "type": "string", "vocabulary": ["x"], "default": 3}],
      "label": {"name": "y", "type": "float"}}, r"feature 'a' \(string\) has default 3; expected a string"),
    ({"features": [{"name": "a", "type": "float"}], "label": {"name": "y", "type": "string", "vocabulary": ["n"]}},
     r"string label 'y' needs a 'vocabulary' of 2 or more distinct class names"),
    ({"features": [{"name": "a b", "type": "float"}, {"name": "a_b", "type": "float"}],
      "label": {"name": "y", "type": "float"}}, r"features 'a b' and 'a_b' both become the model input 'a_b'"),
])
def test_bad_schema_extensions(value, message):
  with pytest.raises(UserError, match=message):
    schema_lib.parse_schema(value, source="s.json")


# ----- bad input: one line naming the file, the record and the column ----------------------------------------


def _inputs(path: str, schema: schema_lib.Schema) -> preflight.Inputs:
  return preflight.Inputs(schema=schema, train_files=[path], eval_files=[], sources={"train": _source(path)})


def _first_error(path: str, schema: schema_lib.Schema) -> str:
  """What the trainer says when the pipeline fails on `path`: TF's error, told to come from the input pipeline,
  named by `data_errors` and caused by TensorFlow's own error."""
  from trainer.planning import data_errors  # pylint: disable=g-import-not-at-top

  with pytest.raises(UserError) as raised, data_errors.translated(_inputs(path, schema)):
    fn = input_pipeline.make_dataset_fn([path], schema, source=_source(path), global_batch_size=64, training=False,
                                        repeat=False)
    for _ in fn(None):
      pass
  assert isinstance(raised.value.__cause__, (tf.errors.InvalidArgumentError, tf.errors.DataLossError))
  return str(raised.value)


def test_bad_records_deep_in_the_files_are_named(iris_files, tmp_path):
  files, frame = iris_files
  schema = schema_inference.infer_schema([files["csv"]], _source(files["csv"]),
                                         schema_inference.InferenceConfig(label="species"), flag="f",
                                         log=lambda _: None)
  bad = frame.copy().astype({"petal length (cm)": object})
  bad.loc[120, "petal length (cm)"] = "n/a"
  csv_path = str(tmp_path / "bad.csv")
  bad.to_csv(csv_path, index=False)
  assert _first_error(csv_path, schema) == (f"--train_data: {csv_path} line 122: column 'petal length (cm)' holds "
                                            "'n/a', but the schema says float")
  unknown = frame.copy()
  unknown.loc[100, "species"] = "rosa"
  jsonl_path = str(tmp_path / "bad.jsonl")
  unknown.to_json(jsonl_path, orient="records", lines=True)
  assert _first_error(jsonl_path, schema) == (
      f"--train_data: {jsonl_path} line 101: label 'species' holds 'rosa', not one of the schema's classes "
      "(setosa, versicolor, virginica)")
  with open(files["csv"]) as f:
    lines = f.read().splitlines()
  blank_path = str(tmp_path / "blank.csv")
  with open(blank_path, "w") as f:
    f.write("\n".join(lines[:90] + [""] + lines[90:]) + "\n")
  assert _first_error(blank_path, schema) == (f"--train_data: {blank_path} line 91: the line is blank; expected a "
                                              "record on every line (remove blank lines)")
  long_path = str(tmp_path / "long.csv")  # a stray comma: decode_csv(select_cols=...) alone would read it
  with open(long_path, "w") as f:
    f.write("\n".join(lines[:130] + [lines[130] + ",7.1"] + lines[131:]) + "\n")
  assert _first_error(long_path, schema) == (f"--train_data: {long_path} line 131: the row has 6 fields, the CSV "
                                             "5 columns")
  no_label = frame.drop(columns=["species"]).iloc[:3]
  missing_path = str(tmp_path / "nolabel.jsonl")
  no_label.to_json(missing_path, orient="records", lines=True)
  assert _first_error(missing_path, schema) == f"--train_data: {missing_path} line 1: column 'species' is empty"


def test_corrupt_gzip_and_undecodable_images(iris_files, tmp_path):
  files, frame = iris_files
  # Cut past the 64 KiB head pre-flight reads (a cut inside it is named there, before any pipeline runs).
  whole = str(tmp_path / "whole.csv.gz")
  noisy = pd.concat([frame] * 40, ignore_index=True)  # random digits: deflate blocks stay small, the cut late
  noisy["sepal length (cm)"] = np.random.default_rng(0).normal(5.8, 0.8, len(noisy))
  noisy.to_csv(whole, index=False, compression="gzip")
  with open(whole, "rb") as f:
    data = f.read()
  truncated = str(tmp_path / "truncated.csv.gz")
  with open(truncated, "wb") as f:
    f.write(data[:len(data) // 2])
  assert len(gzip.decompress(data)) // 2 > 64 * 1024
  schema = schema_inference.infer_schema([files["csv"]], _source(files["csv"]),
                                         schema_inference.InferenceConfig(label="species"), flag="f",
                                         log=lambda _: None)
  message = _first_error(truncated, schema)
  assert message.startswith(f"--train_data: {truncated} is not valid gzip data"), message

  image_schema = schema_lib.parse_schema({"features": [{"name": "image", "type": "image", "shape": [8, 8, 1],
                                                        "encoding": "png"}],
                                          "label": {"name": "digit", "type": "int", "num_classes": 10}}, source="t")
  images, labels = _digits()
  path = str(tmp_path / "images.tfrecord")
  with tf.io.TFRecordWriter(path) as writer:
    for i in range(40):
      data = b"not an image at all" if i == 30 else _png(images[i])
      writer.write(tf.train.Example(features=tf.train.Features(feature={
          "image": tf.train.Feature(bytes_list=tf.train.BytesList(value=[data])),
          "digit": tf.train.Feature(int64_list=tf.train.Int64List(value=[int(labels[i])]))})).SerializeToString())
  assert _first_error(path, image_schema) == (f"--train_data: {path} record 31: feature 'image' is not a PNG, "
                                              "JPEG, GIF or BMP image (it starts b'not an i')")


def test_mixed_compressions_and_formats_under_one_pattern(iris_files, tmp_path):
  files, _ = iris_files
  with pytest.raises(UserError, match=r"^--train_data: the pattern mixes compressions: uncompressed \(.*iris.csv\) "
                                      r"and gzip \(.*iris.csv.gz\)"):
    formats.resolve([files["csv"], files["csv_gz"]], requested="auto", vertex_format=None, flag="--train_data")
  with pytest.raises(UserError, match=r"^--train_data: the pattern mixes csv \(.*iris.csv\) and jsonl"):
    formats.resolve([files["csv"], files["jsonl"]], requested="auto", vertex_format=None, flag="--train_data")
  # gzip data named .csv (gsutil -Z, some exporters): the content decides.
  renamed = tmp_path / "really-gzip.csv"
  with open(files["csv_gz"], "rb") as f:
    renamed.write_bytes(f.read())
  assert _source(str(renamed)).compression == "GZIP"
  zlib_csv = tmp_path / "text.csv.zz"
  zlib_csv.write_bytes(zlib.compress(b"a,b\n1,2\n"))
  assert _source(str(zlib_csv)) == formats.Source("csv", "ZLIB", ("a", "b"), True)
  plain = tmp_path / "x^.csv"  # starts with zlib's header bytes "x^" but is plain text
  plain.write_bytes(b"x^,b\n1,2\n")
  assert _source(str(plain)).compression == ""
  assert gzip.decompress(renamed.read_bytes())  # (the fixture is real gzip)


def test_label_that_is_not_a_column(iris_files):
  files, _ = iris_files
  with pytest.raises(UserError, match=r"^--label='Species' is not a column of .*iris.csv \(columns: sepal length "
                                      r"\(cm\), .*, species\)$"):
    schema_inference.infer_schema([files["csv"]], _source(files["csv"]), schema_inference.InferenceConfig(
        label="Species"), flag="--train_data", log=lambda _: None)


def test_encoder_serving_specs_for_new_feature_kinds():
  schema = schema_lib.parse_schema({"features": [
      {"name": "photo", "type": "image", "shape": [8, 8, 3], "encoding": "jpeg"},
      {"name": "vec", "type": "float", "shape": [4]}],
      "label": {"name": "y", "type": "string", "vocabulary": ["a", "b"]}}, source="t")
  specs = features_lib.raw_serving_specs(schema)
  assert specs["photo"].dtype == tf.string and specs["photo"].shape.as_list() == [None]
  assert specs["vec"].shape.as_list() == [None, 4]


def test_every_format_and_compression_reads_alike_on_gcs(iris_files, gcs, tmp_path):
  """The same files through the emulated bucket: resolved from their first bytes over gs://, read by TensorFlow's
  gs:// client, identical to the local read."""
  from scripts import stage_data  # pylint: disable=g-import-not-at-top

  files, _ = iris_files
  upload = tmp_path / "upload"
  upload.mkdir()
  for name, path in files.items():
    (upload / os.path.basename(path)).write_bytes(open(path, "rb").read())
  stage_data.upload_tree(str(upload), "gs://test-bucket/iris-formats")
  schema = schema_inference.infer_schema([files["csv"]], _source(files["csv"]),
                                         schema_inference.InferenceConfig(label="species"), flag="f",
                                         log=lambda _: None)
  for name in ("csv", "csv_gz", "jsonl", "jsonl_gz", "tfrecord_gz", "tfrecord_zlib"):
    remote = f"gs://test-bucket/iris-formats/{os.path.basename(files[name])}"
    assert _source(remote) == _source(files[name]), name
    remote_features, remote_labels = _read_all(remote, schema, _source(remote))
    local_features, local_labels = _read_all(files[name], schema, _source(files[name]))
    np.testing.assert_array_equal(remote_labels, local_labels, err_msg=name)
    for key, value in local_features.items():
      np.testing.assert_array_equal(remote_features[key], value, err_msg=f"{name} {key}")
  gcs_schema = schema_inference.infer_schema(["gs://test-bucket/iris-formats/iris.jsonl.gz"],
                                             _source("gs://test-bucket/iris-formats/iris.jsonl.gz"),
                                             schema_inference.InferenceConfig(label="species"), flag="f",
                                             log=lambda _: None)
  assert gcs_schema == schema_inference.infer_schema([files["jsonl_gz"]], _source(files["jsonl_gz"]),
                                                     schema_inference.InferenceConfig(label="species"), flag="f",
                                                     log=lambda _: None)


def test_multi_valued_numbers_in_tfrecord(tmp_path):
  """A float_list of 4 per Example (an embedding, as Beam and TFX write one) is one feature of shape [4]."""
  rng = np.random.default_rng(0)
  vectors = rng.normal(size=(50, 4)).astype(np.float32)
  path = str(tmp_path / "vectors.tfrecord")
  with tf.io.TFRecordWriter(path) as writer:
    for i, vector in enumerate(vectors):
      writer.write(tf.train.Example(features=tf.train.Features(feature={
          "embedding": tf.train.Feature(float_list=tf.train.FloatList(value=vector)),
          "y": tf.train.Feature(float_list=tf.train.FloatList(value=[float(vector.sum())]))})).SerializeToString())
  schema = schema_inference.infer_schema([path], _source(path), schema_inference.InferenceConfig(label="y"),
                                         flag="f", log=lambda _: None)
  embedding = schema.feature("embedding")
  assert embedding.shape == (4,) and schema.task == "regression"
  np.testing.assert_allclose(embedding.mean, vectors.mean(axis=0), atol=1e-5)
  features, labels = _read_all(path, schema, _source(path))
  np.testing.assert_array_equal(features["embedding"], vectors)
  np.testing.assert_allclose(labels, vectors.sum(axis=1), rtol=1e-6)
  from trainer.core import config as config_lib  # pylint: disable=g-import-not-at-top
  from trainer.modeling import models  # pylint: disable=g-import-not-at-top

  model = models.build_tabular(schema, config_lib.ModelConfig())
  standardized = model.get_layer("embedding_std")(features["embedding"]).numpy()
  np.testing.assert_allclose(standardized.mean(axis=0), 0, atol=1e-5)
  np.testing.assert_allclose(standardized.std(axis=0), 1, atol=1e-4)


def test_a_new_format_is_one_registered_class(tmp_path):
  """What the registry asks of a format, shown with one it has never seen (pipe-separated values): a class
  registered by `@base.register` is found by its extension and by its content (in its `sniff_order`, before CSV's
  catch-all), described, read and counted in plain Python, its schema inferred and its records checked by
  pre-flight, and read by the trainer's input pipeline (its files' records and one parse per batch, then the
  trainer's own checks and encoding); nothing else lists the formats."""
  from trainer.data.formats import base  # pylint: disable=g-import-not-at-top

  class PipeSeparated(base.DataFormat):
    name, display_name, extensions, sniff_order = "psv", "pipe-separated values", (".psv",), 80

    def sniff(self, path, compression, *, flag):
      return "|" in base.text_head(path, compression, flag=flag).split("\n", 1)[0]

    def records(self, path, source, *, flag):
      with base.open_text(path, source.compression, flag=flag) as f:
        header, *rows = f.read().splitlines()
      for number, row in enumerate(rows, start=2):
        yield f"line {number}", dict(zip(header.split("|"), row.split("|")))

    def count(self, files, source):
      return sum(1 for path in files for _ in self.records(path, source, flag="count"))

    def sampled(self, value):  # what schema inference observes: numbers where the text reads as one
      return float(value) if formats.is_number(value) else value

    def typed_value(self, name, value, *, kind, count, feature):  # what pre-flight checks (by what the kind holds)
      if kind.holds == feature_kinds.STRING:
        return value
      if not formats.is_number(value):
        raise base.ValueProblem(f"column {name!r} holds {value!r}, not a number")
      return float(value)

    def tf_file_records(self, schema, source):
      return lambda path: base.text_lines(path, source, skip=1)  # without the header

    def tf_batch_parser(self, schema, source):
      import tensorflow as tf  # pylint: disable=g-import-not-at-top

      defaults = [tf.constant([], tf.float32), tf.constant([], tf.string), tf.constant([], tf.float32)]
      return lambda lines: base.split_label(
          dict(zip(("tenure", "plan", "churned"), tf.io.decode_csv(lines, defaults, field_delim="|"))), schema)

  named, unnamed = tmp_path / "a.psv", tmp_path / "b.txt"
  for path in (named, unnamed):
    path.write_text("tenure|plan|churned\n3|basic|0\n14|pro|1\n")
  assert formats.resolve([str(named)], requested="auto", vertex_format=None, flag="--train_data").format == "csv"
  base.register(PipeSeparated)
  try:
    for path in (named, unnamed):  # by its extension, then by its content
      source = formats.resolve([str(path)], requested="auto", vertex_format=None, flag="--train_data")
      assert source == formats.Source("psv") and source.describe() == "pipe-separated values"
    assert list(formats.iter_records(str(unnamed), source, flag="--train_data")) == [
        ("line 2", {"tenure": "3", "plan": "basic", "churned": "0"}),
        ("line 3", {"tenure": "14", "plan": "pro", "churned": "1"})]
    assert formats.count_records([str(named), str(unnamed)], source) == 4
    schema = schema_lib.parse_schema({"features": [
        {"name": "tenure", "type": "float"}, {"name": "plan", "type": "string", "vocabulary": ["basic", "pro"]}],
        "label": {"name": "churned", "type": "float"}}, source="t")
    features, labels = _read_all(str(unnamed), schema, source)
    np.testing.assert_array_equal(features["tenure"], [3, 14])
    np.testing.assert_array_equal(features["plan"], [1, 2])  # vocabulary ids, as for every format
    np.testing.assert_array_equal(labels, [0, 1])
    # Schema inference and pre-flight's record check ask the class too.
    sample = tmp_path / "sample.psv"
    sample.write_text("tenure|plan|churned\n" + "".join(f"{3 + i % 20}|{('basic', 'pro')[i % 2]}|{i % 2}\n"
                                                        for i in range(40)))
    inferred = schema_inference.infer_schema([str(sample)], source, schema_inference.InferenceConfig(label="churned"),
                                             flag="--train_data", log=lambda _: None)
    assert {f.name: f.type for f in inferred.features} == {"tenure": "float", "plan": "string"}
    assert inferred.label.num_classes == 2
    assert preflight.record_problem({"tenure": "3", "plan": "pro", "churned": "1"}, inferred, source) is None
    assert preflight.record_problem({"tenure": "three", "plan": "pro", "churned": "1"}, inferred, source) == (
        "column 'tenure' holds 'three', not a number")
    assert preflight.record_problem({"tenure": "3", "plan": "pro", "churned": ""}, inferred, source) == (
        "column 'churned' is empty")
  finally:
    del base.FORMATS["psv"]
  assert formats.resolve([str(unnamed)], requested="auto", vertex_format=None, flag="--train_data").format == "csv"


def test_a_new_feature_kind_is_one_registered_class(tmp_path):
  """What the trainer asks of a feature kind, shown with one it has never seen (a count, log-scaled for the model):
  a `feature_kinds.Kind` subclass registered by `feature_kinds.register` is a schema type; its records are read
  by every format by what it holds (a number), checked by pre-flight, written as a tf.train.Example, encoded in
  the input pipeline and the serving signature, and fed to the built-in tabular model; nothing else names it."""
  from trainer.core import config as config_lib  # pylint: disable=g-import-not-at-top
  from trainer.modeling import models  # pylint: disable=g-import-not-at-top
  from trainer.planning import examples  # pylint: disable=g-import-not-at-top

  class LogCount(feature_kinds.Numeric):
    def __init__(self):
      super().__init__("log_count", example_list="int64_list", parse_dtype="int64", cast=int)

    def encode(self, feature, value, *, table=None):
      return tf.math.log1p(tf.cast(value, tf.float32))

  frame = pd.DataFrame({"visits": [0, 3, 12, 99], "plan": ["basic", "pro", "pro", "basic"],
                        "spend": [1.5, 2.0, 8.25, 30.0]})
  raw = {"features": [{"name": "visits", "type": "log_count", "default": 0},
                      {"name": "plan", "type": "string", "vocabulary": ["basic", "pro"]}],
         "label": {"name": "spend", "type": "float"}}
  with pytest.raises(UserError, match="has type 'log_count'; expected one of float, int, string, text, image$"):
    schema_lib.parse_schema(raw, source="t")
  feature_kinds.register(LogCount())
  try:
    schema = schema_lib.parse_schema(raw, source="t")
    assert schema.feature("visits").is_numeric and schema.feature("visits").kind.example_list == "int64_list"
    with pytest.raises(UserError, match=r"has default 0.5; expected an integer"):
      schema_lib.parse_schema({**raw, "features": [{**raw["features"][0], "default": 0.5}, raw["features"][1]]},
                              source="t")
    # Written the way other tools write each format, then read by the trainer's input pipeline.
    paths = {"csv": tmp_path / "d.csv", "jsonl": tmp_path / "d.jsonl", "parquet": tmp_path / "d.parquet",
             "tfrecord": tmp_path / "d.tfrecord"}
    frame.to_csv(paths["csv"], index=False)
    frame.to_json(paths["jsonl"], orient="records", lines=True)
    frame.to_parquet(paths["parquet"], index=False)
    with tf.io.TFRecordWriter(str(paths["tfrecord"])) as writer:
      for record in frame.to_dict("records"):
        writer.write(examples.serialize(record, schema))
    for name, path in paths.items():
      source = _source(str(path))
      assert source.format == name
      for where, record in formats.iter_records(str(path), source, flag="--train_data"):
        assert preflight.record_problem(record, schema, source) is None, (name, where)
      features, labels = _read_all(str(path), schema, source)
      np.testing.assert_allclose(features["visits"], np.log1p(frame["visits"]), rtol=1e-6, err_msg=name)
      np.testing.assert_array_equal(features["plan"], [1, 2, 2, 1], err_msg=name)
      np.testing.assert_allclose(labels, frame["spend"], rtol=1e-6, err_msg=name)
    assert preflight.record_problem({"visits": "many", "plan": "pro", "spend": "1"}, schema, _source(
        str(paths["csv"]))) == "column 'visits' holds 'many', but the schema says log_count"
    # Serving takes the raw count and encodes it as training did; the built-in model takes it as a number.
    encoded = features_lib.FeatureEncoder(schema).encode({"visits": tf.constant([3], tf.int64),
                                                          "plan": tf.constant(["pro"])})
    np.testing.assert_allclose(encoded["visits"].numpy(), [np.log1p(3)], rtol=1e-6)
    assert features_lib.raw_serving_specs(schema)["visits"].dtype == tf.float32
    model = models.build_tabular(schema, config_lib.ModelConfig())
    assert model(features).shape == (4, 1)
  finally:
    del feature_kinds.KINDS["log_count"]


def test_pandas_index_column_is_named_with_its_remedy(tmp_path):
  """`DataFrame.to_csv(path)` writes the row index as a first column with an empty name (the default most
  tutorials keep): one line that says so and how to write the file instead, not a list of 14 column names."""
  frame = sk_datasets.load_wine(as_frame=True).frame
  path = tmp_path / "wine.csv"
  frame.to_csv(path)  # index=True, pandas' default
  with pytest.raises(UserError) as raised:
    formats.source_for([str(path)], flag="--train_data")
  assert str(raised.value) == (
      f"--train_data: the header of {path} leaves its first column unnamed (, alcohol, malic_acid, ash, ...): that "
      "is the row index pandas' to_csv writes by default; write the file with to_csv(path, index=False), or name "
      "that column in the header")
  frame.to_csv(path, index=False)
  assert formats.source_for([str(path)], flag="--train_data").columns == tuple(frame.columns)


def test_an_empty_string_is_missing_where_the_input_pipeline_reads_it_so():
  """Pre-flight reads a value as the input pipeline does (the formats' value model): an empty CSV field is
  missing whatever its kind (decode_csv fills the default), an empty JSON or Parquet string is a string (the
  pipeline reads ""), an empty JSON value where a number belongs is missing."""
  schema = schema_lib.parse_schema({"features": [
      {"name": "note", "type": "text", "vocabulary": ["ok"]}, {"name": "x", "type": "float"}],
      "label": {"name": "y", "type": "float"}}, source="t")
  for data_format in ("jsonl", "parquet"):
    assert preflight.record_problem({"note": "", "x": 1.0, "y": 0.0}, schema, formats.Source(data_format)) is None
    assert preflight.record_problem({"note": "ok", "x": "", "y": 0.0}, schema, formats.Source(data_format)) == (
        "column 'x' is empty and the schema gives it no default")
  csv = formats.Source("csv", columns=("note", "x", "y"), header=True)
  assert preflight.record_problem({"note": "", "x": "1", "y": "0"}, schema, csv) == (
      "column 'note' is empty and the schema gives it no default")
  assert preflight.record_problem({"note": "ok", "x": "nan", "y": "0"}, schema, csv) == (
      "column 'x' holds 'nan', " + features_lib.NON_FINITE + "; remove the record or give the column a value")
