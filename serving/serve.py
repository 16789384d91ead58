r"""A local endpoint speaking Vertex AI's custom-container contract, with the model loaded as TF Serving loads it.

    python -m serving.serve --model_dir=gs://BUCKET/runs/RUN/model      # or a local dir; then, from another shell:
    curl -s localhost:8080/v1/endpoints/local/deployedModels/local:predict -d '{"instances": [{...}]}'

What Vertex gives a serving container, this takes: the port from AIP_HTTP_PORT (default 8080; --port), the health
and predict routes from AIP_HEALTH_ROUTE / AIP_PREDICT_ROUTE (Vertex's defaults built from AIP_ENDPOINT_ID and
AIP_DEPLOYED_MODEL_ID, "local" here), the model from AIP_STORAGE_URI (or --model_dir). Requests and responses are
Vertex's: `{"instances": [...], "parameters": {...}}` -> `{"predictions": [...], "deployedModelId": "..."}` (the
column form `{"inputs": ...}` too, as TF Serving takes it); a request the model cannot answer is 400 with Google's
error shape `{"error": {"code": 400, "message": ..., "status": "INVALID_ARGUMENT"}}`. Rows are read as training
read them (serving/predict.py): the data's own column names, the label column and any other field that is not an
input ignored (each such field named once on standard error), a missing or null value given the schema's default.
Each request runs in its own thread on the one session (TF sessions are thread-safe).
"""

from __future__ import annotations

import argparse
import errno
import http.server
import json
import os
import signal
import socket
import sys
import threading

from serving import predict

MAX_BODY_BYTES = 1.5 * 1024 * 1024  # Vertex online prediction's request limit


class ServeError(ValueError):
  """A one-line reason the endpoint cannot start."""


def routes(env: dict[str, str]) -> tuple[str, str]:
  """The health and predict routes Vertex gives a container (AIP_HEALTH_ROUTE / AIP_PREDICT_ROUTE)."""
  endpoint = env.get("AIP_ENDPOINT_ID", "local")
  deployed = env.get("AIP_DEPLOYED_MODEL_ID", "local")
  base = f"/v1/endpoints/{endpoint}/deployedModels/{deployed}"
  return env.get("AIP_HEALTH_ROUTE", base), env.get("AIP_PREDICT_ROUTE", f"{base}:predict")


def make_server(model: predict.SessionModel, *, host: str, port: int, health_route: str, predict_route: str,
                deployed_model_id: str) -> http.server.ThreadingHTTPServer:
  noted: set[str] = set()  # fields that are not inputs, already named on standard error
  noted_lock = threading.Lock()

  class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: a client's requests reuse one connection, as Vertex's do
    # Headers and body leave in two writes; with Nagle's algorithm the body waits for the client's delayed ACK
    # (40 ms a request, measured with scripts/bench/serve.py).
    disable_nagle_algorithm = True

    def log_message(self, *args):  # one line per request is noise at 1,000 requests a second
      pass

    def _reply(self, code: int, value: dict) -> None:
      payload = json.dumps(value).encode()
      self.send_response(code)
      self.send_header("Content-Type", "application/json")
      self.send_header("Content-Length", str(len(payload)))
      self.end_headers()
      self.wfile.write(payload)

    def _error(self, code: int, message: str) -> None:
      status = {400: "INVALID_ARGUMENT", 404: "NOT_FOUND", 405: "METHOD_NOT_ALLOWED", 413: "INVALID_ARGUMENT",
                500: "INTERNAL"}[code]
      self._reply(code, {"error": {"code": code, "message": message, "status": status}})

    def do_GET(self):  # noqa: N802
      if self.path.split("?")[0] == health_route:
        return self._reply(200, {})
      if self.path.split("?")[0] == predict_route:
        return self._error(405, f"{predict_route} takes POST")
      return self._error(404, f"no route {self.path}; health: GET {health_route}, predict: POST {predict_route}")

    def do_POST(self):  # noqa: N802
      length = int(self.headers.get("Content-Length") or 0)
      if length > MAX_BODY_BYTES:
        self.rfile.read(length)
        return self._error(413, f"the request is {length} bytes; Vertex online prediction takes at most 1.5 MB")
      body = self.rfile.read(length)
      if self.path.split("?")[0] != predict_route:
        return self._error(404, f"no route {self.path}; predict: POST {predict_route}")
      try:
        request = json.loads(body)
      except ValueError as e:
        return self._error(400, f"the request body is not JSON ({e})")
      if isinstance(request, dict):
        request = {k: v for k, v in request.items() if k != "parameters"}  # Vertex passes them; this model has none
      ignored: set[str] = set()
      try:
        response = predict.predict(model, request, ignored=ignored)
      except predict.PredictError as e:
        return self._error(400, str(e))
      except Exception as e:  # pylint: disable=broad-except  (the server stays up; the client sees why)
        return self._error(500, f"{type(e).__name__}: {e}")
      with noted_lock:  # once per field name: a note per request would drown the log at 1,000 requests a second
        new = ignored - noted
        noted.update(new)
      if new:
        print(f"note: {predict.ignored_note(new)} (first seen in a request to {predict_route}; ignored from now "
              "on without a note)", file=sys.stderr, flush=True)
      return self._reply(200, {**response, "deployedModelId": deployed_model_id})

  class Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128  # the listen backlog: socketserver's 5 resets the 6th client that connects at once

  return Server((host, port), Handler)


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--model_dir", default=os.environ.get("AIP_STORAGE_URI"),
                      help="the exported SavedModel, local or gs:// (default: AIP_STORAGE_URI)")
  parser.add_argument("--port", type=int, default=None, help="default: AIP_HTTP_PORT, else 8080")
  parser.add_argument("--host", default="127.0.0.1", help="0.0.0.0 inside a container")
  parser.add_argument("--signature", default="serving_default")
  args = parser.parse_args(argv)
  try:
    server = start(args, os.environ)
  except (ServeError, predict.PredictError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 2

  def stop(*_):
    threading.Thread(target=server.shutdown, daemon=True).start()

  signal.signal(signal.SIGTERM, stop)  # Vertex stops a container with SIGTERM
  signal.signal(signal.SIGINT, stop)
  server.serve_forever()
  server.server_close()
  return 0


def start(args, env) -> http.server.ThreadingHTTPServer:
  """Checks the flags, loads the model and binds the port (every failure one line); prints where it listens."""
  if not args.model_dir:
    raise ServeError("--model_dir is required (or AIP_STORAGE_URI, as Vertex sets it): the exported SavedModel")
  port = args.port
  if port is None:
    raw = env.get("AIP_HTTP_PORT", "8080")
    if not raw.isdigit():
      raise ServeError(f"AIP_HTTP_PORT={raw!r}: expected a port number")
    port = int(raw)
  flag = "--port" if args.port is not None else "AIP_HTTP_PORT"
  if not 0 <= port <= 65535:
    raise ServeError(f"{flag}={port}: expected a port in 1..65535 (0: any free one)")
  with socket.socket() as probe:  # before the model loads (seconds): a busy port is the first thing to know
    try:
      probe.bind((args.host, port))
    except OSError as e:
      if e.errno == errno.EADDRINUSE:
        raise ServeError(f"{flag}={port}: cannot listen on {args.host}:{port} ({e.strerror}); pick another port "
                         "or stop what holds it") from None
      raise ServeError(f"--host={args.host}: cannot listen there ({e.strerror or e}); expected an address of this "
                       "machine (127.0.0.1, or 0.0.0.0 for every interface)") from None
  model = predict.load(args.model_dir, args.signature)
  health_route, predict_route = routes(env)
  try:
    server = make_server(model, host=args.host, port=port, health_route=health_route, predict_route=predict_route,
                         deployed_model_id=env.get("AIP_DEPLOYED_MODEL_ID", "local"))
  except OSError as e:
    raise ServeError(f"{flag}={port}: cannot listen on {args.host}:{port} ({e.strerror})") from None
  bound = server.server_address[1]
  print(json.dumps({"listening": f"http://{args.host}:{bound}", "health": health_route, "predict": predict_route,
                    "model_dir": args.model_dir, "inputs": sorted(model.inputs)}), flush=True)
  return server


if __name__ == "__main__":
  sys.exit(main())
