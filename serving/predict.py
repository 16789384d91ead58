r"""Answers a Vertex AI online-prediction request from an exported SavedModel, loaded the way TF Serving loads it.

    python -m serving.predict --model_dir=gs://BUCKET/run/model --request=request.json
    echo '{"instances": [{"tenure_months": 3, "plan": "basic", ...}]}' | python -m serving.predict --model_dir=DIR

Vertex's prebuilt TensorFlow prediction containers run TF Serving, which loads a SavedModel the TF1 way: the
MetaGraph's restore op and init op in a session, then the signature's tensors by name. This command does the
same (`tf.compat.v1.saved_model.loader.load`), so an export that answers here loads there; `tf.saved_model.load`
alone would hide a broken restore.

Request and response bodies are those of Vertex / TF Serving's REST API:
- row form `{"instances": [{"feature": value, ...}, ...]}` -> `{"predictions": [{"output": value, ...}, ...]}`
  (a bare value per row when the signature has a single output);
- column form `{"inputs": {"feature": [values], ...}}` -> `{"outputs": {"output": [values], ...}}`.
Binary strings travel as `{"b64": "..."}`. A bad request or instance is one `error:` line naming the instance and
the feature, exit code 2.

A field that is not an input of the model (an id or a name column a raw export carries, the label) is ignored, as
Vertex's tabular models ignore extra columns, and named once on standard error; this is the one place that rule
lives, so the local endpoint (serving/serve.py), the serving image on Vertex (which answers Vertex's batch jobs too)
and `scripts.batch_predict local` agree. One exception: a field that looks like a misspelling of an input the
instance lacks is refused (`'tenure' is not an input ...; did you mean 'tenure_months'`), because filling the
input with its default would answer silently with the wrong value.
"""

from __future__ import annotations

import argparse
import base64
import difflib
import json
import math
import sys
from typing import Any

import numpy as np

from trainer.data.feature_kinds import _IMAGE_MAGIC as IMAGE_MAGIC  # the trainer's own test of image bytes: one rule
from trainer.data.feature_kinds import ENCODED_IMAGES
from trainer.data.feature_kinds import KINDS
from trainer.data.schema import safe_name


class PredictError(ValueError):
  """A request the model cannot answer; the message is one line naming the instance and the feature."""


class SessionModel:
  """A SavedModel signature loaded into a TF1 session, as TF Serving loads it."""

  def __init__(self, model_dir: str, *, signature_name: str = "serving_default"):
    import tensorflow as tf  # pylint: disable=g-import-not-at-top

    self._graph = tf.Graph()
    self._session = tf.compat.v1.Session(graph=self._graph)
    logger, level = tf.get_logger(), tf.get_logger().level
    logger.setLevel("ERROR")  # the TF1 loader logs a deprecation notice: it is the point here, not news
    try:
      meta_graph = tf.compat.v1.saved_model.loader.load(self._session, ["serve"], model_dir)
    finally:
      logger.setLevel(level)
    if signature_name not in meta_graph.signature_def:
      raise PredictError(f"signature {signature_name!r} is not in {model_dir} "
                         f"(it has: {', '.join(n for n in sorted(meta_graph.signature_def) if not n.startswith('__'))})")
    signature = meta_graph.signature_def[signature_name]
    self.inputs = {name: (info.name, tf.dtypes.as_dtype(info.dtype),
                          [d.size for d in info.tensor_shape.dim] if not info.tensor_shape.unknown_rank else None)
                   for name, info in signature.inputs.items()}
    self.outputs = {name: info.name for name, info in signature.outputs.items()}
    self.columns = TrainingColumns.beside(model_dir, self.inputs)

  def input_for(self, field: str) -> str | None:
    """The input a request's field feeds: by its input name or by the data's column name; None for neither."""
    return field if field in self.inputs else self.columns.input_of.get(field)

  def run(self, columns: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    import tensorflow as tf  # pylint: disable=g-import-not-at-top

    feeds = {self.inputs[name][0]: value for name, value in columns.items()}
    try:
      return self._session.run(self.outputs, feeds)
    except (tf.errors.InvalidArgumentError, tf.errors.NotFoundError) as e:
      # A value the signature cannot take (bytes that are not an image, a path where image bytes belong), as TF
      # Serving answers it: 400 with TensorFlow's words.
      lines = [line.strip() for line in e.message.splitlines() if line.strip()]
      said = next((line for line in lines if not line.startswith(("Graph execution error", "[[", "Detected at"))),
                  lines[0] if lines else type(e).__name__)
      raise PredictError(f"the model cannot compute a prediction for these instances: {said.split(' [[')[0]}"
                         ) from None

  def close(self) -> None:
    self._session.close()


class TrainingColumns:
  """What training accepted, from the schema the export was trained with (schema.json beside it): each input's
  column name in the data (`mean radius` for the input `mean_radius`), its default for a missing, null or empty
  value, and the label column (a training row copied verbatim carries it; it is not an input)."""

  def __init__(self, features: list[dict], label: str | None, inputs):
    by_input = {safe_name(f["name"]): f for f in features if safe_name(f["name"]) in inputs}
    # The inputs in the schema's order (the training data's column order): how a list instance is read (Vertex
    # sends each row of a batch's CSV as a list of its values, without the header). Empty without a schema.
    self.order = list(by_input) if len(by_input) == len(inputs) else []
    self.column_of = {name: f["name"] for name, f in by_input.items()}
    self.input_of = {f["name"]: name for name, f in by_input.items()}
    self.defaults = {name: f.get("default") for name, f in by_input.items()}
    self.label = label
    # Inputs that take an image file's bytes ({"b64": ...}; a column of file URIs in training takes the files'
    # bytes in serving too): checked here, so a bad one names its instance and feature.
    self.images = {name for name, f in by_input.items() if KINDS[f["type"]].image
                   and f.get("encoding", "jpeg" if f.get("uri") else "raw") in ENCODED_IMAGES}

  @classmethod
  def beside(cls, model_dir: str, inputs) -> "TrainingColumns":
    import tensorflow as tf  # pylint: disable=g-import-not-at-top

    path = model_dir.rstrip("/") + "/schema.json"
    try:
      with tf.io.gfile.GFile(path) as f:
        schema = json.load(f)
      return cls(list(schema.get("features", [])), (schema.get("label") or {}).get("name"), inputs)
    except (tf.errors.OpError, ValueError, AttributeError, TypeError):
      return cls([], None, inputs)  # an export without its schema (not this trainer's): inputs as they are

  def describe(self, name: str, *, quoted: bool = True) -> str:
    """An input as errors name it: 'mean_radius' (column 'mean radius'), or plain in a list of inputs."""
    column = self.column_of.get(name)
    shown = repr(name) if quoted else name
    return f"{shown} (column {column!r})" if column and column != name else shown


def predict(model: SessionModel, body: Any, *, ignored: set[str] | None = None) -> dict[str, Any]:
  """The response body for one request body (already decoded from JSON). The names of fields that are not inputs
  (ignored, see the module's docstring) are added to `ignored` when it is given, for the caller to report."""
  if not isinstance(body, dict) or ("instances" in body) == ("inputs" in body):
    raise PredictError("the request must be a JSON object with exactly one of 'instances' (rows) or 'inputs' "
                       "(columns)")
  if "instances" in body:
    instances = body["instances"]
    if not isinstance(instances, list) or not instances:
      raise PredictError("'instances' must be a non-empty list of rows")
    columns = _columns_from_rows(model, instances, ignored)
    try:
      outputs = model.run(columns)
    except PredictError as e:
      raise _which_instance(model, columns, e) from None
    rows = [{name: _jsonable(value[i]) for name, value in outputs.items()} for i in range(len(instances))]
    if len(model.outputs) == 1:
      rows = [next(iter(row.values())) for row in rows]
    return {"predictions": rows}
  inputs = body["inputs"]
  if not isinstance(inputs, dict):
    raise PredictError("'inputs' must be an object of feature -> list of values (one per row)")
  lengths = {len(v) for v in inputs.values() if isinstance(v, list)}
  inputs = _as_inputs(model, inputs, where="'inputs'", rows=max(lengths) if lengths else 1, ignored=ignored)
  columns = {name: _to_array(model, name, values, where="'inputs'", batched=True) for name, values in inputs.items()}
  sizes = {len(v) for v in columns.values()}
  if len(sizes) != 1:
    raise PredictError(f"'inputs': every feature needs the same number of rows, got "
                       f"{ {name: len(v) for name, v in columns.items()} }")
  return {"outputs": {name: _jsonable(value) for name, value in model.run(columns).items()}}


def _which_instance(model: SessionModel, columns: dict[str, np.ndarray], error: PredictError) -> PredictError:
  """The graph refused a batch (bytes that are not an image, a file that is not there): the first instance it
  refuses alone, and the image feature whose bytes do not decode, so the message names both. Runs only after a
  failure, one instance at a time."""
  rows = len(next(iter(columns.values())))
  for i in range(rows):
    one = {name: value[i:i + 1] for name, value in columns.items()}
    try:
      if rows > 1:
        model.run(one)
        continue
    except PredictError as e:
      error = e
    for name in sorted(model.columns.images):
      reason = _undecodable(one[name][0])
      if reason:
        return PredictError(f"instance {i}: feature {model.columns.describe(name)} holds image bytes TensorFlow "
                            f"cannot decode ({reason})")
    return PredictError(f"instance {i}: {str(error).replace(' for these instances', '', 1)}")
  return error


def _undecodable(data: bytes) -> str | None:
  """Why TensorFlow's image decoder refuses `data` (as the serving graph decodes it), or None."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  try:
    tf.io.decode_image(data, expand_animations=False)
  except (tf.errors.InvalidArgumentError, ValueError) as e:
    return str(getattr(e, "message", e)).strip().splitlines()[0]
  return None


def _takes(model: SessionModel) -> str:
  return ", ".join(model.columns.describe(name, quoted=False) for name in sorted(model.inputs))


def _as_inputs(model: SessionModel, given: dict, *, where: str, rows: int | None = None,
               ignored: set[str] | None = None) -> dict:
  """A row (or, with `rows`, the column form) as training read it: keyed by input name or by the data's own
  column name, the label column dropped, a field that is not an input ignored (unless it looks like a misspelling
  of an input the row lacks), a missing, null or empty value given the schema's default. Refuses what training
  would: a missing value the schema gives no default."""
  columns = model.columns
  out: dict = {}
  unknown = []
  for key, value in given.items():
    name = model.input_for(key)
    if name is None:
      if key != columns.label:  # a training row copied with its label is not news
        unknown.append(key)
      continue
    if name in out:
      raise PredictError(f"{where}: feature {name!r} is given twice (as {name!r} and as its column "
                         f"{columns.column_of[name]!r})")
    out[name] = value
  if unknown:
    _refuse_misspelling(model, unknown, [name for name in model.inputs if name not in out], where=where)
    if ignored is not None:
      ignored.update(unknown)
  for name in sorted(model.inputs):
    value = out.get(name)
    if rows is not None and value is not None:
      if not isinstance(value, list):
        continue  # judged by _to_array
      value = [_filled(model, name, v, where=where) for v in value]
    elif rows is not None:
      value = [_filled(model, name, None, where=where)] * rows
    else:
      value = _filled(model, name, value, where=where)
    out[name] = value
  return out


def _filled(model: SessionModel, name: str, value: Any, *, where: str) -> Any:
  """`value`, or the feature's default where training would have used it (missing, null, an empty cell)."""
  numeric = model.inputs[name][1].name != "string"
  if isinstance(value, float) and not math.isfinite(value):
    if math.isnan(value):
      value = None  # NaN: how Python's json and pandas' blank cells say "missing"
    else:
      raise PredictError(f"{where}: feature {model.columns.describe(name)} is {value}; expected a finite number")
  if value is None or (value == "" and numeric):
    default = model.columns.defaults.get(name)
    if default is None:
      said = "is missing" if value is None else "is empty"
      raise PredictError(f"{where}: feature {model.columns.describe(name)} {said}, and the schema it was "
                         f"trained with gives it no default (the model takes: {_takes(model)})")
    return default
  if numeric and isinstance(value, str):
    try:
      return float(value)  # a number as text, as a CSV cell holds it (and training read it)
    except ValueError:
      return value  # refused with the feature's name
  return value


def _refuse_misspelling(model: SessionModel, unknown: list[str], lacking: list[str], *, where: str) -> None:
  """An unknown field close to the name of an input the row lacks ('tenure' for 'tenure_months', 'Region' for
  'region') is most likely that input misspelled: refused, where ignoring it would fill the input's default."""
  spellings = {}
  for name in lacking:
    for spelling in (name, model.columns.column_of.get(name) or name):
      spellings[spelling.lower()] = name
  for key in unknown:
    close = difflib.get_close_matches(key.lower(), list(spellings), n=1, cutoff=0.6)
    if close:
      meant = spellings[close[0]]
      raise PredictError(f"{where}: {key!r} is not an input of the model; did you mean "
                         f"{model.columns.describe(meant)}, which this instance lacks? (the model takes: "
                         f"{_takes(model)})")


def _columns_from_rows(model: SessionModel, instances: list, ignored: set[str] | None = None
                       ) -> dict[str, np.ndarray]:
  single = next(iter(model.inputs)) if len(model.inputs) == 1 else None
  values: dict[str, list] = {name: [] for name in model.inputs}
  for i, row in enumerate(instances):
    if isinstance(row, list) and single is not None and _one_value_as_list(model, single, row):
      row = {single: row[0]}
    elif isinstance(row, list) and single is None:
      row = _positional(model, row, where=f"instance {i}")
    elif not isinstance(row, dict) or (single and single not in row):
      if single is None:
        raise PredictError(f"instance {i}: expected an object of feature -> value, got {json.dumps(row)[:80]}")
      row = {single: row}  # TF Serving takes bare values when the signature has one input
    row = _as_inputs(model, row, where=f"instance {i}", ignored=ignored)
    for name, value in row.items():
      values[name].append(_to_array(model, name, value, where=f"instance {i}", batched=False))
  return {name: np.stack(column) for name, column in values.items()}


def _one_value_as_list(model: SessionModel, name: str, row: list) -> bool:
  """A model's only input takes one value a row, and the row came as a list of one value (a one-column CSV row, as
  Vertex sends it), not as the value itself (which a list is for an input of several values a row)."""
  shape = model.inputs[name][2]
  return shape is not None and len(shape) == 1 and len(row) == 1 and not isinstance(row[0], list)


def _positional(model: SessionModel, values: list, *, where: str) -> dict:
  """A list instance (a CSV row, as Vertex's batch prediction sends one) as the inputs in the schema's order."""
  order = model.columns.order
  if order and len(values) == len(order):
    return dict(zip(order, values))
  if not order:
    raise PredictError(f"{where}: a list of {len(values)} values; this model takes its inputs by name (no schema.json "
                       "beside it says their order): send an object of feature -> value")
  columns = ", ".join(model.columns.column_of.get(name, name) for name in order)
  raise PredictError(f"{where}: a list of {len(values)} values (a CSV row, as Vertex sends one); the model takes "
                     f"{len(order)}, in this order: {columns}")


def _to_array(model: SessionModel, name: str, value: Any, *, where: str, batched: bool) -> np.ndarray:
  """One feature's value (a row's, or a whole column when `batched`) as the signature's dtype and shape."""
  _, dtype, shape = model.inputs[name]
  expected = None if shape is None else shape[0 if batched else 1:]
  if dtype.name == "string":
    array = np.asarray(_strings(value, where=where, name=name), dtype=object)
    if name in model.columns.images:
      _check_images(model, name, value, array, where=where)
  else:
    if not _all_numbers(value):
      raise PredictError(f"{where}: feature {name!r} must be a number{'s' if batched else ''} "
                         f"({dtype.name}), got {json.dumps(value)[:80]}")
    try:
      array = np.asarray(value, dtype=dtype.as_numpy_dtype)
    except ValueError:
      raise PredictError(f"{where}: feature {name!r} is a ragged list; expected shape "
                         f"{_shape_text(expected)}") from None
  if expected is not None and (array.ndim != len(expected)
                               or any(e not in (-1, a) for e, a in zip(expected, array.shape))):
    raise PredictError(f"{where}: feature {name!r} has shape {_shape_text(list(array.shape))}; the model takes "
                       f"{_shape_text(expected)}")
  return array


def _strings(value: Any, *, where: str, name: str):
  if isinstance(value, list):
    return [_strings(v, where=where, name=name) for v in value]
  if isinstance(value, dict) and set(value) == {"b64"} and isinstance(value["b64"], str):
    try:
      return base64.b64decode(value["b64"], validate=True)
    except ValueError:
      raise PredictError(f"{where}: feature {name!r} has a 'b64' value that is not base64") from None
  if isinstance(value, str):
    return value.encode()
  raise PredictError(f"{where}: feature {name!r} must be a string (or {{\"b64\": ...}}), got {json.dumps(value)[:80]}")


def _check_images(model: SessionModel, name: str, given: Any, array: np.ndarray, *, where: str) -> None:
  """Image bytes start as a PNG, JPEG, GIF or BMP file does (the trainer's own check, trainer/data/feature_kinds.py);
  anything else is refused naming the instance and the feature, and what it held."""
  for data, sent in zip(array.ravel(), given if isinstance(given, list) else [given]):
    if not data.startswith(IMAGE_MAGIC):
      held = (f"its 'b64' holds {len(data)} bytes starting {data[:8]!r}" if isinstance(sent, dict) else
              f"got the text {str(sent)[:40]!r}; image bytes travel as {{\"b64\": ...}}")
      raise PredictError(f"{where}: feature {model.columns.describe(name)} is not a PNG, JPEG, GIF or BMP image "
                         f"({held})")


def _all_numbers(value: Any) -> bool:
  if isinstance(value, list):
    return all(_all_numbers(v) for v in value)
  return isinstance(value, (int, float)) and not isinstance(value, bool)


def _shape_text(shape: list[int] | None) -> str:
  return "any" if shape is None else "[" + ", ".join("?" if d == -1 else str(d) for d in shape) + "]"


def _jsonable(value: Any) -> Any:
  value = np.asarray(value)
  if value.dtype == object or value.dtype.kind == "S":  # string outputs (e.g. class_name), whole or one row's
    return [v.decode(errors="replace") for v in value.ravel()] if value.ndim else value.item().decode(errors="replace")
  return value.tolist()


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--model_dir", required=True, help="the exported SavedModel (local or gs://)")
  parser.add_argument("--request", default="-", help="request body JSON file (default: standard input)")
  parser.add_argument("--signature", default="serving_default")
  args = parser.parse_args(argv)
  try:
    text = sys.stdin.read() if args.request == "-" else _read(args.request)
    try:
      body = json.loads(text)
    except json.JSONDecodeError as e:
      raise PredictError(f"--request: not valid JSON ({e.msg} at line {e.lineno})") from None
    model = load(args.model_dir, args.signature)
    ignored: set[str] = set()
    try:
      response = predict(model, body, ignored=ignored)
    finally:
      model.close()
  except PredictError as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  if ignored:
    print(f"note: {ignored_note(ignored)}", file=sys.stderr)
  print(json.dumps(response))
  return 0


def ignored_note(names: set[str]) -> str:
  """How every caller words the fields it ignored (one rule, one sentence)."""
  listed = ", ".join(repr(n) for n in sorted(names))
  return f"ignored {listed}: not {'an input' if len(names) == 1 else 'inputs'} of the model"


def _read(path: str) -> str:
  try:
    with open(path) as f:
      return f.read()
  except OSError as e:
    raise PredictError(f"--request: cannot read {path} ({e.strerror})") from None


def load(model_dir: str, signature: str = "serving_default") -> SessionModel:
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  try:
    return SessionModel(model_dir, signature_name=signature)
  except (OSError, tf.errors.OpError) as e:
    detail = str(getattr(e, "message", None) or e).strip().splitlines()[0]
    raise PredictError(f"--model_dir: cannot load a SavedModel from {model_dir} ({detail})") from None


if __name__ == "__main__":
  sys.exit(main())
