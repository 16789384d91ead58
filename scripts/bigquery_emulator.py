"""A local BigQuery Storage Read API: tables from CSV or Parquet files, served over gRPC to the real client.

    python -m scripts.bigquery_emulator --table my-project.my_dataset.penguins=data/penguins.csv &
    export BIGQUERY_STORAGE_EMULATOR_HOST=127.0.0.1:PORT    # the line it prints
    python -m trainer.task --train_data=bq://my-project.my_dataset.penguins --label=species ...

No BigQuery emulator is on the package index (goccy/bigquery-emulator is a Go program), and the trainer reads
tables through the Storage Read API only, so this serves that API's `BigQueryRead` service (CreateReadSession,
ReadRows) from `google-cloud-bigquery-storage`'s own protos: the real client speaks the real protocol to it. It
serves Arrow (the format the trainer asks for; Avro sessions are refused), applies a session's column selection
and row restriction (a SQL predicate, evaluated by DuckDB as BigQuery's would be on these types), and splits a
session into up to `max_stream_count` streams of contiguous rows. Names, errors and status codes are BigQuery's
own for what the trainer and users hit: an unknown table (NOT_FOUND), an unknown column or a bad filter
(INVALID_ARGUMENT).

Not emulated: SplitReadStream, snapshot times, sample percentages, Avro, and BigQuery's own type system (a
table's columns are the Arrow types pyarrow reads from the file: int64, double, string, binary, bool, lists).
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import sys
import threading
from concurrent import futures

_SERVICE = "google.cloud.bigquery.storage.v1.BigQueryRead"
EMULATOR_HOST = "BIGQUERY_STORAGE_EMULATOR_HOST"  # what the trainer reads (trainer/data/formats/bigquery.py)
_ROWS_PER_RESPONSE = 4096  # BigQuery sends responses up to 10 MiB; small enough for tests to cross batches
_DEFAULT_STREAMS = 4  # max_stream_count 0 means "the server decides"
_SERVER_THREADS = 128


@dataclasses.dataclass
class _Stream:
  table: object  # pyarrow.Table: this stream's rows, its columns the session's selection


class BigQueryReadEmulator:
  """`tables` ({"project.dataset.table": pyarrow.Table}) served on 127.0.0.1:`port` (0: a free one)."""

  def __init__(self, tables: dict, *, port: int = 0, request_log: str | None = None):
    import grpc  # pylint: disable=g-import-not-at-top
    from google.cloud.bigquery_storage_v1 import types  # pylint: disable=g-import-not-at-top

    self._tables = dict(tables)
    self._streams: dict[str, _Stream] = {}
    self._sessions = itertools.count(1)
    self._lock = threading.Lock()
    self.requests: list[tuple[str, object]] = []  # (method, request) as received
    self._request_log = request_log  # also appended there as JSON lines: what tests of other processes read back
    handlers = {
        "CreateReadSession": grpc.unary_unary_rpc_method_handler(
            self._create_read_session, request_deserializer=types.CreateReadSessionRequest.deserialize,
            response_serializer=types.ReadSession.serialize),
        "ReadRows": grpc.unary_stream_rpc_method_handler(
            self._read_rows, request_deserializer=types.ReadRowsRequest.deserialize,
            response_serializer=types.ReadRowsResponse.serialize),
    }
    # A ReadRows call holds a server thread until its client reads it to the end or cancels it, and input pipelines
    # leave streams open that no one reads any more (BigQuery expires them); so many threads, not a handful.
    # No SO_REUSEPORT: a port another server holds is refused, not shared (which would answer half the requests).
    self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=_SERVER_THREADS),
                               options=[("grpc.so_reuseport", 0)])
    self._server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(_SERVICE, handlers),))
    self.port = self._server.add_insecure_port(f"127.0.0.1:{port}")
    self._server.start()

  @property
  def host(self) -> str:
    return f"127.0.0.1:{self.port}"

  @property
  def env(self) -> dict[str, str]:
    """What a process sets to read these tables (the trainer's `BIGQUERY_STORAGE_EMULATOR_HOST`)."""
    return {EMULATOR_HOST: self.host}

  def stop(self) -> None:
    self._server.stop(grace=None)

  def _received(self, method: str, request) -> None:
    self.requests.append((method, request))
    if self._request_log:
      line = json.dumps({"method": method, "request": type(request).to_dict(request, use_integers_for_enums=False)})
      with self._lock, open(self._request_log, "a", encoding="utf-8") as f:
        f.write(line + "\n")

  def _create_read_session(self, request, context):
    import grpc  # pylint: disable=g-import-not-at-top
    from google.cloud.bigquery_storage_v1 import types  # pylint: disable=g-import-not-at-top

    self._received("CreateReadSession", request)
    session = request.read_session
    parts = session.table.split("/")
    if len(parts) != 6 or parts[0] != "projects" or parts[2] != "datasets" or parts[4] != "tables":
      context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"Invalid table name: {session.table!r}; expected "
                    "projects/{project}/datasets/{dataset}/tables/{table}")
    table_id = f"{parts[1]}.{parts[3]}.{parts[5]}"
    if table_id not in self._tables:
      context.abort(grpc.StatusCode.NOT_FOUND, f"Not found: Table {parts[1]}:{parts[3]}.{parts[5]} was not found "
                    "in location US")
    if session.data_format != types.DataFormat.ARROW:
      context.abort(grpc.StatusCode.UNIMPLEMENTED, "this emulator serves Arrow sessions only")
    table = self._tables[table_id]
    selected = list(session.read_options.selected_fields) or table.column_names
    unknown = [name for name in selected if name not in table.column_names]
    if unknown:
      context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"request failed: Column {unknown[0]} not found in table "
                    f"{table_id}")
    restriction = session.read_options.row_restriction
    if restriction:  # on every column of the table, selected or not, as BigQuery's
      table = self._filtered(table, restriction, context)
    table = table.select(selected)
    wanted = request.max_stream_count or _DEFAULT_STREAMS
    count = min(wanted, table.num_rows) if table.num_rows else 0
    session_id = f"session-{next(self._sessions)}"
    name = f"projects/{parts[1]}/locations/us/sessions/{session_id}"
    streams = []
    for i in range(count):  # contiguous rows, as even as they divide
      start, end = table.num_rows * i // count, table.num_rows * (i + 1) // count
      stream_name = f"{name}/streams/{i}"
      with self._lock:
        self._streams[stream_name] = _Stream(table.slice(start, end - start))
      streams.append(types.ReadStream(name=stream_name))
    return types.ReadSession(
        name=name, table=session.table, data_format=types.DataFormat.ARROW, read_options=session.read_options,
        arrow_schema=types.ArrowSchema(serialized_schema=table.schema.serialize().to_pybytes()),
        streams=streams, estimated_row_count=table.num_rows,
        estimated_total_bytes_scanned=table.nbytes)

  @staticmethod
  def _filtered(table, restriction: str, context):
    """The rows BigQuery's row restriction keeps: the predicate as SQL over the table, by DuckDB."""
    import duckdb  # pylint: disable=g-import-not-at-top
    import grpc  # pylint: disable=g-import-not-at-top

    connection = duckdb.connect()
    try:
      connection.register("session_table", table)
      return connection.sql(f"SELECT * FROM session_table WHERE {restriction}").to_arrow_table()
    except duckdb.Error as e:
      context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"request failed: row restriction {restriction!r}: "
                    f"{str(e).splitlines()[0]}")
    finally:
      connection.close()

  def _read_rows(self, request, context):
    import grpc  # pylint: disable=g-import-not-at-top
    from google.cloud.bigquery_storage_v1 import types  # pylint: disable=g-import-not-at-top

    self._received("ReadRows", request)
    with self._lock:
      stream = self._streams.get(request.read_stream)
    if stream is None:
      context.abort(grpc.StatusCode.NOT_FOUND, f"Stream {request.read_stream} not found or expired")
    table = stream.table.slice(request.offset)
    schema = types.ArrowSchema(serialized_schema=table.schema.serialize().to_pybytes())
    first = True
    for batch in table.to_batches(max_chunksize=_ROWS_PER_RESPONSE):
      if not batch.num_rows:
        continue
      response = types.ReadRowsResponse(
          arrow_record_batch=types.ArrowRecordBatch(serialized_record_batch=batch.serialize().to_pybytes(),
                                                    row_count=batch.num_rows),
          row_count=batch.num_rows)
      if first:
        response.arrow_schema = schema
        first = False
      yield response


def read_table(path: str):
  """A table from a file as pyarrow reads it: Parquet (.parquet, .pq) or CSV (a header row; types inferred)."""
  import pyarrow.csv  # pylint: disable=g-import-not-at-top
  import pyarrow.parquet  # pylint: disable=g-import-not-at-top

  if path.lower().endswith((".parquet", ".pq")):
    return pyarrow.parquet.read_table(path)
  return pyarrow.csv.read_csv(path)


def _table_arg(value: str) -> tuple[str, str]:
  table_id, sep, path = value.partition("=")
  if not sep or table_id.count(".") != 2 or not path:
    raise argparse.ArgumentTypeError(f"--table={value!r}; expected PROJECT.DATASET.TABLE=FILE (a .csv or .parquet)")
  return table_id, path


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(prog="python -m scripts.bigquery_emulator", description=__doc__.split("\n")[0])
  parser.add_argument("--table", type=_table_arg, action="append", required=True,
                      help="PROJECT.DATASET.TABLE=FILE: a table served from a CSV or Parquet file (repeatable)")
  parser.add_argument("--port", type=int, default=0, help="the port on 127.0.0.1 (default: a free one)")
  parser.add_argument("--request_log", default=None,
                      help="append each request received to this file as a JSON line ({method, request})")
  args = parser.parse_args(argv)
  tables = {}
  for table_id, path in args.table:
    if table_id in tables:
      print(f"error: --table={table_id}=...: that table is named twice; give each table one file", file=sys.stderr)
      return 2
    try:
      tables[table_id] = read_table(path)
    except (OSError, ValueError) as e:  # pyarrow's errors are both
      print(f"error: --table={table_id}={path}: {str(e).splitlines()[0]}", file=sys.stderr)
      return 2
  try:
    emulator = BigQueryReadEmulator(tables, port=args.port, request_log=args.request_log)
  except RuntimeError as e:  # gRPC: "Failed to bind to address"
    print(f"error: --port={args.port}: cannot listen there ({str(e).splitlines()[0]}); pick a free port, or 0",
          file=sys.stderr)
    return 2
  for table_id, table in tables.items():
    print(f"# bq://{table_id}: {table.num_rows} rows, columns {', '.join(table.column_names)}", file=sys.stderr)
  print(f"export {EMULATOR_HOST}={emulator.host}", flush=True)
  try:
    threading.Event().wait()
  except KeyboardInterrupt:
    pass
  finally:
    emulator.stop()
  return 0


if __name__ == "__main__":
  sys.exit(main())
