"""BigQuery tables (`bq://PROJECT.DATASET.TABLE`), read through the BigQuery Storage Read API as Arrow.

A split is one or more tables, each named the way Vertex's managed tabular datasets name theirs
(`AIP_TRAINING_DATA_URI=bq://project.dataset.table` with `AIP_DATA_FORMAT=bigquery`), or given as --train_data.
An optional row filter follows the name: `bq://project.dataset.table?where=split = 'TRAIN'`, BigQuery's
`row_restriction` (a SQL predicate, evaluated by BigQuery), so one table can hold every split.

Each read opens a read session that selects the schema's columns only and asks for Arrow, the format the
Storage Read API streams fastest and the one Parquet's reader already turns into batches: the input pipeline
is Parquet's (`parquet.rebatched`) over the session's record batches, so types, nulls and defaults are checked
the same way. One input pipeline reads up to `_STREAMS` streams of a session at once, in threads. When a
multi-worker job has more input pipelines than tables, every pipeline reads the table as one stream and keeps
every n-th row (record sharding, as for a single file): read sessions are independent snapshots whose streams
do not partition alike, so streams cannot be divided between workers without a coordinator.

The client is `google-cloud-bigquery-storage` (the `bigquery` extra), imported only when a table is read. With
`BIGQUERY_STORAGE_EMULATOR_HOST=host:port` it speaks plain gRPC to that address without credentials, as
`STORAGE_EMULATOR_HOST` does for Cloud Storage (`python -m scripts.bigquery_emulator` serves one).
"""

from __future__ import annotations

import atexit
import dataclasses
import importlib
import os
import queue
import random
import threading
from typing import Any, Iterator

from trainer.core.errors import first_line
from trainer.core.errors import UserError
from trainer.data.feature_kinds import Kind
from trainer.data.formats import base
from trainer.data.formats import parquet

SCHEME = "bq://"
EMULATOR_HOST = "BIGQUERY_STORAGE_EMULATOR_HOST"
_WHERE = "?where="
_STREAMS = 4  # streams one input pipeline reads at once (BigQuery may give fewer: small tables get one)
_QUEUED_BATCHES = 8  # record batches read ahead per pipeline, across its streams
_EMULATOR_CONNECT_SECS = 10
_REPLAY_BYTES = 256 << 20  # a table's rows up to this size are read once per training run and replayed each pass


@dataclasses.dataclass(frozen=True)
class Table:
  """One `bq://` URI: the table and the row filter after its name."""

  project: str
  dataset: str
  table: str
  where: str = ""

  @property
  def path(self) -> str:
    """The Storage Read API's name for it."""
    return f"projects/{self.project}/datasets/{self.dataset}/tables/{self.table}"

  @property
  def uri(self) -> str:
    return f"{SCHEME}{self.project}.{self.dataset}.{self.table}" + (f"{_WHERE}{self.where}" if self.where else "")


def is_table(uri: str) -> bool:
  return uri.startswith(SCHEME)


def parse(uri: str, *, flag: str) -> Table:
  """`bq://PROJECT.DATASET.TABLE[?where=PREDICATE]`; anything else is one line naming `flag`."""
  name, _, where = uri[len(SCHEME):].partition(_WHERE)
  parts = name.rsplit(".", 2)  # a domain-scoped project ("example.com:proj") holds a dot itself
  if len(parts) != 3 or not all(p.strip() for p in parts) or "/" in name or "?" in name:
    raise UserError(f"{flag}={uri!r}: expected a BigQuery table as bq://PROJECT.DATASET.TABLE, optionally followed "
                    "by ?where=PREDICATE (a row filter, e.g. bq://my-project.ds.penguins?where=split='TRAIN')")
  if _WHERE in uri and not where.strip():
    raise UserError(f"{flag}={uri!r}: the row filter after ?where= is empty; give a predicate or drop ?where=")
  return Table(*parts, where=where.strip())


def _billing_project(table: Table) -> str:
  """Whose quota a read session uses: the job's project on Vertex (a public dataset's project would refuse the
  job's service account), else the table's."""
  return os.environ.get("CLOUD_ML_PROJECT_ID") or os.environ.get("GOOGLE_CLOUD_PROJECT") or table.project


_CLIENTS: dict[str | None, Any] = {}  # emulator host (None: BigQuery) -> this process's client
_environ = None  # the run's environment (`BigQueryFormat.configure`); os.environ for tools that give none


def _client(emulator_host: str | None):
  if emulator_host not in _CLIENTS:
    from google.cloud import bigquery_storage_v1  # pylint: disable=g-import-not-at-top

    if not _CLIENTS:
      atexit.register(_close_clients)
    if emulator_host:
      import grpc  # pylint: disable=g-import-not-at-top
      from google.cloud.bigquery_storage_v1.services.big_query_read.transports import grpc as transports  # pylint: disable=g-import-not-at-top

      channel = grpc.insecure_channel(emulator_host, options=[("grpc.max_receive_message_length", -1)])
      try:  # an emulator that is not there fails now, not after the client's retries (600 s)
        grpc.channel_ready_future(channel).result(timeout=_EMULATOR_CONNECT_SECS)
      except grpc.FutureTimeoutError:
        channel.close()
        raise UserError(f"{EMULATOR_HOST}={emulator_host}: no BigQuery Storage Read API answers there within "
                        f"{_EMULATOR_CONNECT_SECS} s; start one (python -m scripts.bigquery_emulator --table ...) "
                        "and export the line it prints, or unset the variable to read BigQuery itself") from None
      _CLIENTS[emulator_host] = bigquery_storage_v1.BigQueryReadClient(
          transport=transports.BigQueryReadGrpcTransport(channel=channel))
    else:
      _CLIENTS[emulator_host] = bigquery_storage_v1.BigQueryReadClient()
  return _CLIENTS[emulator_host]


def _close_clients() -> None:
  """Closes every client's channel at exit: a ReadRows call an abandoned input pipeline left open (its generator
  never finalized) would otherwise hold up the interpreter's exit in gRPC's shutdown."""
  for reader in _CLIENTS.values():
    reader.transport.close()


def client(*, flag: str):
  """The process's read client (one per emulator setting), or one line saying what to install or configure."""
  try:
    for package in ("google.cloud.bigquery_storage_v1", "pyarrow"):  # either missing: this message, not Parquet's
      importlib.import_module(package)
  except ImportError:
    raise UserError(f"{flag}: reading BigQuery needs google-cloud-bigquery-storage and pyarrow: pip install "
                    "'vertex-tf-trainer[bigquery]' into the image, or export the table to gs:// (Parquet or CSV) "
                    "and pass the files") from None
  import google.auth.exceptions  # pylint: disable=g-import-not-at-top

  given = _environ.get(EMULATOR_HOST, "") if _environ is not None else os.environ.get(EMULATOR_HOST, "")
  emulator_host = given.strip() or None
  if emulator_host:
    # host:port, as the emulator prints it; a URL's http:// (STORAGE_EMULATOR_HOST's form) is taken off, as gRPC
    # reads "http" as a host name.
    emulator_host = emulator_host.removeprefix("http://").rstrip("/")
    host, _, port = emulator_host.rpartition(":")
    if not host or not port.isdigit() or "/" in emulator_host:
      raise UserError(f"{EMULATOR_HOST}={given!r}: expected HOST:PORT (e.g. 127.0.0.1:9060), "
                      "as python -m scripts.bigquery_emulator prints it")
  try:
    return _client(emulator_host)
  except google.auth.exceptions.DefaultCredentialsError as e:
    raise UserError(f"{flag}: no Google credentials to read BigQuery with ({first_line(e)}); on Vertex the job's "
                    "service account is used; locally run gcloud auth application-default login, or set "
                    f"{EMULATOR_HOST} for an emulator") from None


def read_session(table: Table, *, columns: list[str] | None = None, streams: int = 1, flag: str):
  """A read session of `table` in Arrow: `columns` only (None: every column), its row filter, up to `streams`
  streams. An unknown table, column or bad filter is one line naming `flag` and BigQuery's own words."""
  from google.api_core import exceptions  # pylint: disable=g-import-not-at-top
  from google.cloud.bigquery_storage_v1 import types  # pylint: disable=g-import-not-at-top

  reader = client(flag=flag)
  requested = types.ReadSession(
      table=table.path, data_format=types.DataFormat.ARROW,
      read_options=types.ReadSession.TableReadOptions(selected_fields=columns or [], row_restriction=table.where))
  try:
    return reader.create_read_session(parent=f"projects/{_billing_project(table)}", read_session=requested,
                                      max_stream_count=streams)
  except exceptions.GoogleAPICallError as e:
    raise UserError(f"{flag}: {table.uri}: {first_line(e.message or str(e))}; expected a table this job's "
                    "credentials can read"
                    + (", with the columns and filter given" if columns or table.where else "")) from None


def arrow_schema(session, *, flag: str):
  """The session's columns as a pyarrow Schema."""
  pa = parquet._pyarrow(flag)  # pylint: disable=protected-access
  return pa.ipc.read_schema(pa.py_buffer(session.arrow_schema.serialized_schema))


def column_types(table: Table, *, flag: str) -> dict[str, Any]:
  """{column: Arrow type} of the table as the Storage Read API serves it."""
  schema = arrow_schema(read_session(table, flag=flag), flag=flag)
  return {field.name: field.type for field in schema}


def stream_batches(session, stream_name: str, *, flag: str) -> Iterator[Any]:
  """One stream's rows as pyarrow RecordBatches. The client's stream resumes a broken connection from its offset;
  each response's Arrow IPC batch is read against the session's schema here (the client's own Arrow conversion
  is deprecated in favour of pandas-gbq's, which the trainer does not need)."""
  from google.api_core import exceptions  # pylint: disable=g-import-not-at-top

  pa = parquet._pyarrow(flag)  # pylint: disable=protected-access
  schema = arrow_schema(session, flag=flag)
  try:
    for response in client(flag=flag).read_rows(stream_name):
      if response.row_count:
        yield pa.ipc.read_record_batch(pa.py_buffer(response.arrow_record_batch.serialized_record_batch), schema)
  except exceptions.GoogleAPICallError as e:
    raise UserError(f"{flag}: reading {stream_name}: {first_line(e.message or str(e))}") from None


def _session_batches(table: Table, columns: list[str] | None, *, streams: int, ordered: bool,
                     flag: str) -> Iterator[Any]:
  """Every record batch of one session of `table`: its streams read at once in threads (`ordered`: one after
  another, the same order every read)."""
  session = read_session(table, columns=columns, streams=streams, flag=flag)
  names = [stream.name for stream in session.streams]
  if ordered or len(names) <= 1:
    for name in names:
      yield from stream_batches(session, name, flag=flag)
    return
  ahead: queue.Queue = queue.Queue(_QUEUED_BATCHES)
  done = object()
  stop = threading.Event()  # set when the consumer stops (the input pipeline is done with this session)

  def hand_over(item) -> bool:
    while not stop.is_set():
      try:
        ahead.put(item, timeout=0.5)
        return True
      except queue.Full:
        continue
    return False

  def read(name):
    batches = stream_batches(session, name, flag=flag)
    try:
      for batch in batches:
        if not hand_over(batch):
          return
    except BaseException as e:  # pylint: disable=broad-except  (raised in the consumer's thread)
      hand_over(e)
    finally:
      batches.close()  # ends the ReadRows call now, not at garbage collection (an open call can hold up exit)
      hand_over(done)

  readers = [threading.Thread(target=read, args=(name,), daemon=True) for name in names]
  for thread in readers:
    thread.start()
  try:
    finished = 0
    while finished < len(readers):
      item = ahead.get()
      if item is done:
        finished += 1
      elif isinstance(item, BaseException):
        raise item
      else:
        yield item
  finally:
    stop.set()
    for thread in readers:
      thread.join(timeout=5)


@base.register
class BigQueryFormat(base.DataFormat):
  name = "bigquery"
  display_name = "BigQuery table"
  vertex_names = ("bigquery",)
  reads_files = False
  unit = "table"
  converts_to_examples = True

  def configure(self, environ) -> None:
    global _environ  # pylint: disable=global-statement  (one run per process; tests run several, each configures)
    _environ = dict(environ)

  def claims_listing(self, files: list[str]) -> bool:
    return bool(files) and all(is_table(uri) for uri in files)

  def sniff(self, path: str, compression: str, *, flag: str) -> bool:
    return False

  def records(self, path: str, source: base.Source, *, flag: str) -> Iterator[tuple[str, dict[str, Any]]]:
    number = 0
    for batch in _session_batches(parse(path, flag=flag), None, streams=1, ordered=True, flag=flag):
      for row in batch.to_pylist():
        number += 1
        yield f"row {number}", row

  def count(self, files: list[str], source: base.Source) -> int:
    """Rows after the filter, read as one column: the Storage Read API has no count, and its estimate is not one."""
    total = 0
    for uri in files:
      table = parse(uri, flag="--train_data")
      first_column = next(iter(column_types(table, flag="--train_data")))
      total += sum(batch.num_rows for batch in _session_batches(table, [first_column], streams=_STREAMS,
                                                                 ordered=False, flag="--train_data"))
    return total

  def check_schema(self, schema, source: base.Source, files: list[str], *, flag: str) -> None:
    for uri in files:
      table = parse(uri, flag=flag)
      problem = parquet.type_mismatch(column_types(table, flag=flag), schema, where=f"{flag}: {uri}")
      if problem:
        name, found, kind, wanted = problem
        raise UserError(f"{flag}: {uri}: column {name!r} is {found} in Arrow (BigQuery's Storage Read API), which "
                        f"cannot hold the schema's {kind.type}; expected {wanted}: read a view that casts it "
                        f"(SELECT CAST({name} AS ...)), or leave it out of the schema")

  def check_split(self, files: list[str], *, flag: str) -> None:
    for uri in files:
      parse(uri, flag=flag)

  def parameter_server_problem(self) -> str | None:
    return ("a BigQuery table cannot be read under ParameterServerStrategy: its workers run the input pipeline "
            "without Python, and TensorFlow has no BigQuery op. Export the table to gs:// as CSV or TFRecord "
            "(bq extract --destination_format=CSV), or train under a synchronous strategy (one machine, or chief "
            "+ workers without parameter servers)")

  def check_for_inference(self, files: list[str], *, label: str | None, flag: str) -> None:
    for uri in files:
      found = column_types(parse(uri, flag=flag), flag=flag)
      unreadable = {name: kind for name, kind in parquet.unreadable_types(found).items() if name != label}
      if unreadable:
        name, kind = next(iter(unreadable.items()))
        raise UserError(f"{flag}: {uri}: column {name!r} is {kind} in Arrow, which no schema type holds "
                        f"({len(unreadable)} such column(s): {', '.join(unreadable)}); read a view that casts it "
                        "(a TIMESTAMP to UNIX_SECONDS(...), a NUMERIC to FLOAT64), or give a schema.json without it")

  def typed_value(self, name: str, value: Any, *, kind: Kind, count: int, feature) -> Any:
    return base.FORMATS[parquet.ParquetFormat.name].typed_value(name, value, kind=kind, count=count, feature=feature)

  def tf_batches(self, files: list[str], schema, source: base.Source, plan: base.ReadPlan):
    """Python (the Storage Read client and pyarrow) hands over chunks of many batches, as Parquet's reader does."""
    import tensorflow as tf  # pylint: disable=g-import-not-at-top

    mine = files[plan.pipeline_id::plan.num_pipelines] if plan.shard_files else files
    keep_every, keep_offset = (plan.num_pipelines, plan.pipeline_id) if plan.shard_records else (1, 0)
    chunk = plan.batch_size * max(1, parquet.CHUNK_ROWS // plan.batch_size)
    # Record sharding needs every pipeline to see the rows in one order: one stream, read in order.
    ordered = plan.shard_records or plan.deterministic
    columns = list(schema.columns)

    def one_pass():
      for uri in mine:
        table = parse(uri, flag=plan.flag)
        for batch in _session_batches(table, columns, streams=1 if ordered else _STREAMS, ordered=ordered,
                                      flag=plan.flag):
          yield uri, batch

    def record_batches():
      """Every pass reads the tables again, unless the first pass's rows fit `_REPLAY_BYTES`: then later passes
      replay them from memory (each read session costs BigQuery a round trip of its own, which a small table's
      many passes would otherwise pay every epoch), the batches reshuffled each pass where the plan shuffles."""
      kept, kept_bytes = [], 0
      for uri, batch in one_pass():
        if kept is not None:
          kept_bytes += batch.nbytes
          if kept_bytes <= _REPLAY_BYTES:
            kept.append((uri, batch))
          else:
            kept = None
        yield uri, batch
      if not plan.repeat:
        return
      rng = random.Random(plan.seed)
      while True:
        if kept is None:
          yield from one_pass()
          continue
        order = list(kept)
        if plan.shuffle and not plan.shard_records:
          rng.shuffle(order)
        yield from order

    def generate():
      yield from parquet.rebatched(record_batches(), schema, batch_size=chunk, keep_every=keep_every,
                                   keep_offset=keep_offset, drop_remainder=False, flag=plan.flag)

    ds = tf.data.Dataset.from_generator(generate, output_signature=parquet.output_signature(schema))
    ds = ds.map(lambda batch: parquet.strings_from_buffers(batch, schema), num_parallel_calls=tf.data.AUTOTUNE)
    return ds.rebatch(plan.batch_size, drop_remainder=plan.training)

  def tf_batch_parser(self, schema, source: base.Source):
    return lambda columns: base.split_label(columns, schema)
