r"""Batch prediction as Vertex AI's BatchPredictionJob does it: locally over files, or sent to Vertex.

    python -m scripts.batch_predict local --model_dir=gs://B/runs/R/model --input='gs://B/new/*.jsonl' \
        --output_dir=gs://B/predictions/R
    python -m scripts.batch_predict submit --model=projects/P/locations/L/models/ID --input='gs://B/new/*.csv' \
        --output_dir=gs://B/predictions --project=P --region=L [--machine_type=n1-standard-4] [--dry_run]

`local` reads every instance of the input files (JSONL: one JSON instance a line; CSV as Vertex reads it: each row
the list of its values, without the header, a value in double quotes text and any other a number, so the columns
must be the model's inputs in order; TFRecord: tf.train.Example records), answers them with the model loaded as TF
Serving loads it (serving/predict.py: column names, nulls and empty cells read as training read them), and writes
Vertex's output layout in a new `prediction-<model>-<time>` folder under --output_dir (as Vertex names it, so runs
never mix): `prediction.results-NNNNN-of-NNNNN` lines of
`{"instance": ..., "prediction": ...}` and `prediction.errors_stats-00000-of-00001` lines of
`{"instance": ..., "error": {"code": 3, "message": ...}}` for the instances the model cannot answer. A bad instance
never stops the job. The files appear when the job is done (written under temporary names first).

Vertex's `instanceConfig` decides what reaches the model, here as in the job `submit` sends (the same flags):
--key_field=F takes F out of what is sent and writes `{"key": <F's value>, "prediction": ...}` instead of the
instance; --included_fields=A,B sends only those fields; --excluded_fields=C,D sends all but those (the output's
instance keeps them); the two lists exclude each other; --instance_type=array sends the included fields' values as
a list, in their order. A field none of these name and the model does not take (an id, a name) is ignored by the
model as the serving container ignores it (serving/predict.py: one rule for the endpoint, the serving image on
Vertex and this command), and listed in the summary as `ignored_fields`.

A run that predicts nothing (every instance an error, or no instance at all) exits 2 with one `error:` line that
says how many failed and why the first did; a run where some fail exits 0 and says how many on standard error.

`submit` sends the BatchPredictionJob (JobService) for a registered model with the same input, instanceConfig and
output.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import dataclasses
import datetime
import gzip
import io
import json
import os
import re
import sys
from typing import Any, Iterator

from scripts import clients
from scripts import progress as progress_lib
from serving import predict

FORMATS = {".jsonl": "jsonl", ".json": "jsonl", ".csv": "csv", ".tfrecord": "tfrecord"}
INVALID_ARGUMENT = 3  # google.rpc.Code, as Vertex writes it in errors_stats
ERRORS_FILE = "prediction.errors_stats-00000-of-00001"


class BatchError(ValueError):
  """A one-line reason the batch cannot run."""


def input_files(pattern: str) -> list[str]:
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  files = sorted(tf.io.gfile.glob(pattern))
  if not files:
    raise BatchError(f"--input={pattern}: no file matches (local paths and gs:// patterns are read)")
  return files


def input_format(files: list[str], given: str) -> str:
  if given != "auto":
    return given
  kinds = {f: FORMATS.get(os.path.splitext(f[:-3] if f.endswith(".gz") else f)[1].lower()) for f in files}
  unknown = [f for f, kind in kinds.items() if kind is None]
  if unknown:
    raise BatchError(f"--input: cannot tell the format of {unknown[0]} from its name (.jsonl, .csv, .tfrecord, "
                     "optionally .gz); pass --format=jsonl|csv|tfrecord")
  if len(set(kinds.values())) > 1:
    raise BatchError(f"--input matches files of several formats ({', '.join(sorted(set(kinds.values())))}); a "
                     "batch reads one: narrow the pattern")
  return next(iter(kinds.values()))


@dataclasses.dataclass(frozen=True)
class InstanceConfig:
  """Vertex's BatchPredictionJob.InstanceConfig (aiplatform_v1): which fields of each input instance reach the
  model, in which form, and what the output carries in place of the instance."""

  instance_type: str = "object"
  key_field: str | None = None
  included_fields: tuple[str, ...] = ()
  excluded_fields: tuple[str, ...] = ()

  def check(self, kind: str) -> None:
    """Refuses what Vertex refuses (or would apply differently) for input of `kind`, one line naming the flag."""
    if self.included_fields and self.excluded_fields:
      raise BatchError(f"--included_fields={','.join(self.included_fields)} and --excluded_fields="
                       f"{','.join(self.excluded_fields)}: Vertex takes one or the other (what is sent, or what is "
                       "not)")
    if kind == "csv" and (self.included_fields or self.excluded_fields or self.instance_type == "array"):
      flag = (f"--included_fields={','.join(self.included_fields)}" if self.included_fields else
              f"--excluded_fields={','.join(self.excluded_fields)}" if self.excluded_fields else
              "--instance_type=array")
      raise BatchError(f"{flag}: Vertex applies it to JSONL objects (and TFRecord), not to CSV input; with CSV, "
                       "--key_field passes an id column to the output, and a column the model does not take is "
                       "ignored")
    if self.instance_type == "array" and not self.included_fields:
      raise BatchError("--instance_type=array: needs --included_fields, the fields whose values make the list, in "
                       "order (Vertex requires it for JSONL objects)")

  def request(self) -> dict:
    """The job's instanceConfig (REST JSON): only what is set."""
    config: dict[str, Any] = {"instanceType": self.instance_type}
    if self.key_field:
      config["keyField"] = self.key_field
    if self.included_fields:
      config["includedFields"] = list(self.included_fields)
    if self.excluded_fields:
      config["excludedFields"] = list(self.excluded_fields)
    return config

  @property
  def reshapes(self) -> bool:
    return bool(self.key_field or self.included_fields or self.excluded_fields or self.instance_type == "array")

  def split(self, instance: Any) -> tuple[Any, Any, str | None]:
    """(what the model is sent, what the output shows in its place, why the instance cannot be sent or None).
    The output shows `{"key": value}` under --key_field, else the instance: as read (excluded fields attached,
    as Vertex attaches them), or as sent when --included_fields chose its fields."""
    if not self.reshapes:
      return instance, {"instance": instance}, None
    if not isinstance(instance, dict):
      return None, {"instance": instance}, ("is not a JSON object; --key_field, --included_fields, "
                                            "--excluded_fields and --instance_type=array take objects")
    if self.key_field and self.key_field not in instance:
      return None, {"instance": instance}, f"has no field {self.key_field!r} (--key_field)"
    left_out = set(self.excluded_fields) | ({self.key_field} if self.key_field else set())
    if self.included_fields:
      fields = [f for f in self.included_fields if f not in left_out]
      if self.instance_type == "array":
        sent: Any = [instance.get(f) for f in fields]
      else:
        sent = {f: instance[f] for f in fields if f in instance}
    else:
      sent = {k: v for k, v in instance.items() if k not in left_out}
    if self.key_field:
      return sent, {"key": instance[self.key_field]}, None
    return sent, {"instance": sent if self.included_fields else instance}, None


def field_list(flag: str, text: str | None) -> tuple[str, ...]:
  """A comma-separated flag's field names."""
  if not text:
    return ()
  names = tuple(n.strip() for n in text.split(","))
  if not all(names):
    raise BatchError(f"{flag}={text}: an empty field name; expected names separated by commas (Name,Ticket)")
  return names


def instances(files: list[str], kind: str) -> Iterator[tuple[str, Any]]:
  """Every instance of every file, as Vertex's request would carry it (a bad line: a `_BadLine`), with where it
  is (`new.jsonl line 3`), for the summary's first error."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  for path in files:
    if kind == "tfrecord":
      compression = "GZIP" if path.endswith(".gz") else ""
      records = tf.data.TFRecordDataset(path, compression_type=compression).as_numpy_iterator()
      for number, record in enumerate(records, 1):
        yield f"{os.path.basename(path)} record {number}", _example_instance(record)
      continue
    with tf.io.gfile.GFile(path, "rb") as f:
      raw = f.read()
    if path.endswith(".gz"):
      raw = gzip.decompress(raw)
    text = raw.decode("utf-8-sig")
    if kind == "jsonl":
      for number, line in enumerate(text.splitlines(), 1):
        if line.strip():
          where = f"{os.path.basename(path)} line {number}"
          try:
            yield where, json.loads(line)
          except ValueError as e:
            yield where, _BadLine(line, f"{where} is not JSON ({e})")
    else:
      yield from _csv_rows(path, text)


def csv_header(text: str) -> list[str]:
  return next(csv.reader(io.StringIO(text)), [])


def _csv_rows(path: str, text: str) -> Iterator[tuple[str, Any]]:
  """A CSV file's rows as Vertex reads them for a batch job: a value in double quotes is a string, any other a
  number (an unquoted word fails that row); an empty cell is a missing value. Each row as {header name: value},
  in the header's order (`_RowOfCsv`), which `run_local` sends as the list Vertex sends."""
  header = csv_header(text)
  reader = csv.reader(io.StringIO(text), quoting=csv.QUOTE_NONNUMERIC)
  with contextlib.suppress(ValueError, StopIteration):
    next(reader)  # the header (its unquoted names are no numbers)
  lines = text.splitlines()
  while True:
    first_line = reader.line_num + 1  # where the record starts (a quoted line break makes it span lines)
    try:
      row = next(reader)
    except StopIteration:
      return
    except ValueError as e:
      where = f"{os.path.basename(path)} line {first_line}"
      yield where, _BadLine("\n".join(lines[first_line - 1:reader.line_num]),
                            f"{where}: {e}; Vertex reads an unquoted CSV value as a number: put text in double "
                            "quotes (pandas: to_csv(..., quoting=csv.QUOTE_NONNUMERIC))")
      continue
    where = f"{os.path.basename(path)} line {first_line}"
    if not row:
      continue
    if len(row) != len(header):  # fewer fields than the header, or more
      yield where, _BadLine(",".join(map(str, row)), f"{where} has {len(row)} fields; its header has {len(header)}")
      continue
    yield where, _RowOfCsv(zip(header, (None if value == "" else value for value in row)))


class _RowOfCsv(dict):
  """A CSV row by header name (for --key_field); sent to the model as the list of its values, as Vertex sends it."""


class _BadLine:
  def __init__(self, text: str, reason: str):
    self.text, self.reason = text, reason


def _example_instance(record: bytes) -> dict:
  import base64  # pylint: disable=g-import-not-at-top

  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  row = {}
  for name, feature in tf.train.Example.FromString(record).features.feature.items():
    kind = feature.WhichOneof("kind")
    values = list(getattr(feature, kind).value) if kind else []
    if kind == "bytes_list":
      values = [v.decode() if _is_text(v) else {"b64": base64.b64encode(v).decode()} for v in values]
    row[name] = values[0] if len(values) == 1 else values
  return row


def _is_text(value: bytes) -> bool:
  try:
    value.decode("utf-8")
  except UnicodeDecodeError:
    return False
  return True


def run_local(model: predict.SessionModel, files: list[str], kind: str, output_dir: str, *, batch_size: int,
              results_per_file: int, config: InstanceConfig = InstanceConfig(),
              progress: progress_lib.Progress | None = None) -> dict[str, Any]:
  """Answers every instance; writes Vertex's results and errors files; returns the counts, the fields the model
  ignored, and where the first error was and why (`first_error`, None when none failed). `progress`: told of
  each batch answered (default: a bar on a terminal, a line every 10 s elsewhere, on stderr)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  results: list[str] = []
  errors: list[str] = []
  first_error: list[str] = []
  ignored: set[str] = set()
  given: set[str] = set()  # inputs some instance carried a value for (by input or column name)
  batch: list[tuple[str, Any]] = []

  def fail(where: str, shown: dict, message: str) -> None:
    errors.append(json.dumps({**_echo(shown), "error": {"code": INVALID_ARGUMENT, "message": message}}))
    if not first_error:
      first_error.append(f"{where}: {message}" if not message.startswith(where) else message)

  def flush() -> int:
    """Answers the batch at once; when the model refuses it, one instance at a time, in input order, so only
    the bad ones go to errors_stats. Returns how many instances it answered (results and errors)."""
    prepared = []  # (where, what is sent, what the output shows, why it cannot be sent or None)
    for where, instance in batch:
      if isinstance(instance, _BadLine):
        prepared.append((where, None, {"instance": instance.text}, instance.reason))
        continue
      sent, shown, why = config.split(instance)
      if isinstance(instance, _RowOfCsv) and why is None:  # Vertex sends a CSV row as a list, without its header
        sent = list(sent.values())
        shown = shown if "key" in shown else {"instance": sent}
      prepared.append((where, sent, shown, why and f"the instance {why}"))
    good = [sent for _, sent, _, why in prepared if why is None]
    for sent in good:
      if isinstance(sent, dict):
        given.update(model.input_for(k) for k, v in sent.items() if v is not None)
      else:
        given.update(model.inputs)  # a bare value or a list: the model's one input
    try:
      answered = predict.predict(model, {"instances": good}, ignored=ignored)["predictions"] if good else []
    except predict.PredictError:
      answered = None
    for where, sent, shown, why in prepared:
      if why is not None:
        fail(where, shown, why)
        continue
      if answered is not None:
        results.append(json.dumps({**_echo(shown), "prediction": answered.pop(0)}))
        continue
      try:
        (prediction,) = predict.predict(model, {"instances": [sent]}, ignored=ignored)["predictions"]
        results.append(json.dumps({**_echo(shown), "prediction": prediction}))
      except predict.PredictError as e:
        fail(where, shown, str(e).replace("instance 0: ", "", 1))
    batch.clear()
    return len(prepared)

  with progress or progress_lib.Progress(total=None, what="batch prediction", unit="instance") as reporter:
    for item in instances(files, kind):
      batch.append(item)
      if len(batch) >= batch_size:
        reporter.advance(flush())
    reporter.advance(flush())
  shards = max(1, -(-len(results) // results_per_file))
  written = []
  for shard in range(shards):
    lines = results[shard * results_per_file:(shard + 1) * results_per_file]
    written.append((f"prediction.results-{shard:05d}-of-{shards:05d}", lines))
  written.append((ERRORS_FILE, errors))
  for name, lines in written:  # temporary names first: a crash leaves nothing that looks like a result
    with tf.io.gfile.GFile(f"{output_dir.rstrip('/')}/.{name}.tmp", "w") as f:
      f.write("".join(line + "\n" for line in lines))
  for name, _ in written:
    tf.io.gfile.rename(f"{output_dir.rstrip('/')}/.{name}.tmp", f"{output_dir.rstrip('/')}/{name}", overwrite=True)
  counts: dict[str, Any] = {"instances": len(results) + len(errors), "predictions": len(results),
                            "errors": len(errors), "result_files": shards}
  if ignored:
    counts["ignored_fields"] = sorted(ignored)
  if results:
    never_given = sorted(set(model.inputs) - given)
    if never_given:  # each got the schema's default: likely a column the input files lack, or name differently
      counts["defaulted_inputs"] = never_given
  counts["first_error"] = first_error[0] if first_error else None
  return counts


def _echo(instance: Any) -> Any:
  """The instance as the results echo it, in standard JSON: a NaN (read as missing) becomes null."""
  if isinstance(instance, dict):
    return {k: _echo(v) for k, v in instance.items()}
  if isinstance(instance, list):
    return [_echo(v) for v in instance]
  if isinstance(instance, float) and instance != instance:
    return None
  return instance


def output_folder(output_dir: str, model_dir: str, now: datetime.datetime | None = None) -> str:
  """Where a run writes, as Vertex does: a new `prediction-<model>-<time>` folder under --output_dir, so a later
  run never mixes its files with an earlier one's."""
  now = now or datetime.datetime.now(datetime.timezone.utc)
  parts = [p for p in model_dir.rstrip("/").split("/") if p]
  name = parts[-2] if len(parts) >= 2 and parts[-1] == "model" else (parts[-1] if parts else "model")
  stamp = now.strftime("%Y_%m_%dT%H_%M_%S_") + f"{now.microsecond // 1000:03d}Z"
  return f"{output_dir.rstrip('/')}/prediction-{re.sub(r'[^A-Za-z0-9_.-]', '_', name)}-{stamp}"


def batch_request(*, parent: str, display_name: str, model: str, input_uris: list[str], kind: str,
                  output_dir: str, machine_type: str, replicas: int,
                  config: InstanceConfig = InstanceConfig()) -> dict:
  """The CreateBatchPredictionJobRequest body (REST JSON)."""
  return {
      "parent": parent,
      "batchPredictionJob": {
          "displayName": display_name,
          "model": model,
          "inputConfig": {"instancesFormat": kind, "gcsSource": {"uris": input_uris}},
          # Each row sent as an object keyed by its column names (unless --instance_type says otherwise), as the
          # signature's named inputs take it; the key, included and excluded fields as the flags give them.
          "instanceConfig": config.request(),
          "outputConfig": {"predictionsFormat": "jsonl", "gcsDestination": {"outputUriPrefix": output_dir}},
          "dedicatedResources": {"machineSpec": {"machineType": machine_type}, "startingReplicaCount": replicas,
                                 "maxReplicaCount": replicas},
      },
  }


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("command", choices=("local", "submit"))
  parser.add_argument("--input", required=True, help="files or a pattern, local or gs://")
  parser.add_argument("--output_dir", required=True)
  parser.add_argument("--format", default="auto", choices=("auto", "jsonl", "csv", "tfrecord"))
  parser.add_argument("--model_dir", default=None, help="local: the exported SavedModel; submit: the export the "
                      "registered model serves, to check a CSV input's columns against it before sending")
  parser.add_argument("--batch_size", type=int, default=64)
  parser.add_argument("--results_per_file", type=int, default=100_000)
  parser.add_argument("--model", default=None, help="submit: the registered model (projects/P/locations/L/models/ID)")
  parser.add_argument("--project", default=os.environ.get("PROJECT"))
  parser.add_argument("--region", default=os.environ.get("REGION", "us-central1"))
  parser.add_argument("--machine_type", default="n1-standard-4")
  parser.add_argument("--replica_count", type=int, default=1)
  parser.add_argument("--display_name", default="vertex-tf-trainer-batch")
  parser.add_argument("--key_field", default=None,
                      help="a field (an id) not sent to the model; the output carries it as `key` instead of the "
                      "instance (Vertex's instanceConfig.keyField)")
  parser.add_argument("--included_fields", default=None,
                      help="comma-separated: send only these fields (instanceConfig.includedFields; JSONL)")
  parser.add_argument("--excluded_fields", default=None,
                      help="comma-separated: send all fields but these; the output's instance keeps them "
                      "(instanceConfig.excludedFields; JSONL)")
  parser.add_argument("--instance_type", default="object", choices=("object", "array"),
                      help="what each instance reaches the model as (instanceConfig.instanceType); array takes "
                      "--included_fields for the order")
  parser.add_argument("--dry_run", action="store_true")
  parser.add_argument("--api_endpoint", default=os.environ.get("VERTEX_API_ENDPOINT"), help=argparse.SUPPRESS)
  args = parser.parse_args(argv)
  try:
    if args.batch_size < 1 or args.results_per_file < 1 or args.replica_count < 1:
      raise BatchError("--batch_size, --results_per_file and --replica_count take a count >= 1")
    if args.key_field is not None and not args.key_field.strip():
      raise BatchError("--key_field=: expected a field name (the id column whose value the output carries)")
    args.config = InstanceConfig(instance_type=args.instance_type, key_field=args.key_field or None,
                                 included_fields=field_list("--included_fields", args.included_fields),
                                 excluded_fields=field_list("--excluded_fields", args.excluded_fields))
    if args.command == "local":
      return _local(args)
    return _submit(args)
  except (BatchError, predict.PredictError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 2


def _local(args) -> int:
  if not args.model_dir:
    raise BatchError("local needs --model_dir (the exported SavedModel, local or gs://)")
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  files = input_files(args.input)
  kind = input_format(files, args.format)
  args.config.check(kind)
  if tf.io.gfile.exists(args.output_dir) and not tf.io.gfile.isdir(args.output_dir):
    raise BatchError(f"--output_dir={args.output_dir}: a file is there; expected a directory (made if missing)")
  model = predict.load(args.model_dir)
  try:
    if args.config.instance_type == "array" and len(model.inputs) > 1:
      raise BatchError(f"--instance_type=array: each instance would reach the model as a list of values, and its "
                       f"signature takes {len(model.inputs)} inputs by name ({', '.join(sorted(model.inputs))}): "
                       "use --instance_type=object (the default)")
    if kind == "csv":
      check_csv_headers(files, model, key_field=args.config.key_field)
    key_input = args.config.key_field and model.input_for(args.config.key_field)
    if key_input:
      raise BatchError(f"--key_field={args.config.key_field}: the model takes it as its input "
                       f"{model.columns.describe(key_input)}, and a key field is not sent to the model (as on "
                       "Vertex): key by a field the model does not take, or leave --key_field out (each output "
                       "line then carries its instance)")
    folder = output_folder(args.output_dir, args.model_dir)
    try:
      tf.io.gfile.makedirs(folder)
    except tf.errors.OpError as e:
      raise BatchError(f"--output_dir={args.output_dir}: cannot make {folder} ({e.message.splitlines()[0]})"
                       ) from None
    counts = run_local(model, files, kind, folder, batch_size=args.batch_size,
                       results_per_file=args.results_per_file, config=args.config)
  finally:
    model.close()
  first_error = counts.pop("first_error")
  print(json.dumps({**counts, "output_dir": folder, "input_files": len(files), "format": kind}), flush=True)
  total, failed = counts["instances"], counts["errors"]
  if total == 0:
    raise BatchError(f"--input={args.input}: its {len(files)} file(s) hold no instance; nothing was predicted")
  where = f"{folder}/{ERRORS_FILE}"
  if counts["predictions"] == 0:
    raise BatchError(f"no prediction: all {total} instances failed; the first at {first_error} (every error in "
                     f"{where})")
  if failed:
    print(f"warning: {failed} of {total} instances failed; the first at {first_error} (every error in {where})",
          file=sys.stderr)
  if counts.get("defaulted_inputs"):
    print(f"warning: no instance gave {', '.join(model.columns.describe(n) for n in counts['defaulted_inputs'])}: "
          "every prediction used the schema's default for it (a column the input lacks, or names otherwise?)",
          file=sys.stderr)
  return 0


def check_csv_headers(files: list[str], model: predict.SessionModel, *, key_field: str | None) -> None:
  """Vertex sends each CSV row to the model as the list of its values, without the header: so the columns (but
  the --key_field, which Vertex leaves out) must be the model's inputs in their order. One line if not."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  order = model.columns.order
  expected = [model.columns.column_of.get(name, name) for name in order]
  for path in files:
    with tf.io.gfile.GFile(path, "rb") as f:
      first = (gzip.GzipFile(fileobj=f) if path.endswith(".gz") else f).readline()  # the header line alone
    header = [name for name in csv_header(first.decode("utf-8-sig")) if name != key_field]
    as_inputs = [model.input_for(name) or name for name in header]
    if not order or as_inputs != order:
      extra = [name for name, as_input in zip(header, as_inputs) if as_input not in order]
      rest_in_order = [n for n in as_inputs if n in order] == order
      if len(extra) == 1 and rest_in_order and extra[0] == model.columns.label:
        key_hint = f"; leave out the label column {extra[0]!r}"
      elif len(extra) == 1 and rest_in_order and not key_field:
        key_hint = f"; if {extra[0]!r} is an id, --key_field={extra[0]} keeps it out of what is sent and in the output"
      else:
        key_hint = ""
      raise BatchError(f"--input: {path} has the columns {', '.join(header) or '(none)'}"
                       f"{' (besides the --key_field)' if key_field else ''}; Vertex sends each CSV row to the model "
                       "as the list of its values, without the header, so they must be the model's inputs in "
                       f"order: {', '.join(expected) or '(by name only: this export has no schema.json)'} (or give "
                       f"JSONL: one object per line, by name, other fields ignored){key_hint}")


def _submit(args) -> int:
  if not args.model or not re.fullmatch(r"projects/[^/]+/locations/[^/]+/models/[^/]+", args.model):
    raise BatchError(f"--model={args.model!r}: expected a registered model, projects/P/locations/L/models/ID "
                     "(scripts.submit --upload_model prints it)")
  if not args.project:
    raise BatchError("--project is required (or set PROJECT)")
  inputs = [u for u in args.input.split(",") if u]
  if not all(u.startswith("gs://") for u in inputs) or not args.output_dir.startswith("gs://"):
    raise BatchError("submit reads --input and writes --output_dir in Cloud Storage: gs:// URIs (patterns allowed)")
  kind = input_format(inputs, args.format)
  args.config.check(kind)
  if kind == "tfrecord":
    raise BatchError("--input: Vertex sends each TFRecord record to the model as one {\"b64\": ...} value, and this "
                     "export's signature takes features by name: give Vertex JSONL or CSV (local reads TFRecord "
                     "files as tf.train.Examples)")
  if kind == "csv":
    if args.model_dir:
      import tensorflow as tf  # pylint: disable=g-import-not-at-top

      model = predict.load(args.model_dir)
      try:
        check_csv_headers([path for uri in inputs for path in sorted(tf.io.gfile.glob(uri))], model,
                          key_field=args.config.key_field)
      finally:
        model.close()
    else:
      print("note: --input is CSV: Vertex sends each row as the list of its values, without the header, so the "
            "columns must be the model's inputs in order; --model_dir=EXPORT checks them before sending",
            file=sys.stderr)
  request = batch_request(parent=f"projects/{args.project}/locations/{args.region}", display_name=args.display_name,
                          model=args.model, input_uris=inputs, kind=kind, output_dir=args.output_dir,
                          machine_type=args.machine_type, replicas=args.replica_count, config=args.config)
  from google.cloud import aiplatform_v1  # pylint: disable=g-import-not-at-top
  from google.protobuf import json_format  # pylint: disable=g-import-not-at-top

  parsed = aiplatform_v1.CreateBatchPredictionJobRequest()
  json_format.ParseDict(request, parsed._pb)  # pylint: disable=protected-access  (checked before it is printed)
  if args.dry_run:
    print(json.dumps(request, indent=2))
    return 0
  client = aiplatform_v1.JobServiceClient(**clients.vertex_kwargs(args.region, args.api_endpoint))
  job = client.create_batch_prediction_job(request=parsed)
  print(f"submitted {job.name}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
