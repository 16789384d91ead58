"""The TLS-terminating CONNECT proxy in front of fake-gcs-server, run as its own process:

    python -m scripts.emulator.proxy --upstream_port=P --cert=C --key=K [--fail_rate=0.1 --seed=0] [--ready_file=F]

TensorFlow's C++ client cannot be pointed at an endpoint: it always calls https://www.googleapis.com and
https://storage.googleapis.com. Its libcurl honours `all_proxy` and `CURL_CA_BUNDLE`, so the proxy accepts
CONNECT for those hosts only, terminates TLS with the throwaway CA, and forwards the requests to fake-gcs-server.
It drops TF's `Transfer-Encoding: identity` header (fake-gcs answers 501 to it) and rewrites resumable-upload
`Location`s back to https. `--fail_rate` makes it answer a share of requests with a 503 or a dropped
connection, to show that clients retry. Every other CONNECT target is refused: nothing leaves 127.0.0.1.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import signal
import socket
import socketserver
import ssl
import sys
import threading
import urllib.parse

GOOGLE_HOSTS = ("www.googleapis.com", "storage.googleapis.com")
_STREAM_ABOVE = 256 * 1024
_STREAM_CHUNK = 256 * 1024


class _Faults:
  """Decides, per forwarded request, whether to inject a failure (seeded, so runs repeat)."""

  def __init__(self, rate: float, seed: int):
    self.rate = rate
    self._random = random.Random(seed)
    self._lock = threading.Lock()
    self.injected = 0
    self.forwarded = 0

  def pick(self) -> str | None:
    with self._lock:
      self.forwarded += 1
      if self.rate and self._random.random() < self.rate:
        self.injected += 1
        return "503" if self.injected % 2 else "drop"
      return None


class _ProxyServer(socketserver.ThreadingTCPServer):
  daemon_threads = True
  allow_reuse_address = True

  def __init__(self, port: int, upstream: tuple[str, int], tls: ssl.SSLContext, faults: _Faults):
    super().__init__(("127.0.0.1", port), _ProxyHandler)
    self.upstream = upstream
    self.tls = tls
    self.faults = faults
    self.uploads = _Uploads()


class _Uploads:
  """Resumable-upload sessions whose data reached fake-gcs-server.

  Faults are injected before a request is forwarded, so a session either received its whole body (one PUT, as
  TensorFlow uploads a file) or nothing. After a failed PUT, TensorFlow asks the session for its status (PUT,
  `Content-Range: bytes */N`, empty body). Real Cloud Storage answers `308 Resume Incomplete` while nothing is
  persisted; fake-gcs-server answers 200 and stores an empty object. The proxy answers those itself.
  """

  def __init__(self):
    self._lock = threading.Lock()
    self._complete: set[str] = set()

  @staticmethod
  def session(target: str) -> str | None:
    return urllib.parse.parse_qs(urllib.parse.urlsplit(target).query).get("upload_id", [None])[0]

  @staticmethod
  def is_status_query(method: str, headers: dict[str, str], body: bytes) -> bool:
    return method == "PUT" and not body and headers.get("content-range", "").startswith("bytes */")

  def completed(self, session: str) -> None:
    with self._lock:
      self._complete.add(session)

  def is_complete(self, session: str) -> bool:
    with self._lock:
      return session in self._complete


class _NoDelayConnection(http.client.HTTPConnection):
  """http.client sends headers and body in separate writes: without TCP_NODELAY each costs a delayed ACK."""

  def connect(self):
    super().connect()
    self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


class _ProxyHandler(socketserver.StreamRequestHandler):
  server: _ProxyServer

  def handle(self) -> None:
    request_line = self.rfile.readline(65537).decode("latin-1").strip()
    _read_headers(self.rfile)
    parts = request_line.split()
    if len(parts) != 3 or parts[0] != "CONNECT":
      self.wfile.write(b"HTTP/1.1 405 Method Not Allowed\r\nContent-Length: 0\r\n\r\n")
      return
    host, _, port = parts[1].rpartition(":")
    if host not in GOOGLE_HOSTS or port != "443":
      # Only the storage hosts are emulated; anything else would leave the machine.
      self.wfile.write(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n")
      return
    self.wfile.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
    self.wfile.flush()
    self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
      tls_socket = self.server.tls.wrap_socket(self.connection, server_side=True)
    except (ssl.SSLError, OSError):
      return
    with tls_socket, tls_socket.makefile("rb") as reader:
      upstream = _NoDelayConnection(*self.server.upstream, timeout=60)
      try:
        while self._forward_one(reader, tls_socket, upstream, host):
          pass
      except (OSError, http.client.HTTPException, ValueError):
        pass
      finally:
        upstream.close()

  def _forward_one(self, reader, client: ssl.SSLSocket, upstream: http.client.HTTPConnection, host: str) -> bool:
    line = reader.readline(65537).decode("latin-1").strip()
    if not line:
      return False
    method, target, _ = line.split(" ", 2)
    headers = _read_headers(reader)
    if headers.get("expect", "").lower() == "100-continue":
      # Else libcurl waits a full second before sending an upload's body.
      client.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
    body = _read_body(reader, headers)
    session = _Uploads.session(target)
    if session and _Uploads.is_status_query(method, headers, body) and not self.server.uploads.is_complete(session):
      client.sendall(b"HTTP/1.1 308 Resume Incomplete\r\nContent-Length: 0\r\n\r\n")  # nothing persisted
      return True
    fault = self.server.faults.pick()
    if fault == "drop":
      client.shutdown(socket.SHUT_RDWR)
      return False
    if fault == "503":
      payload = b'{"error": {"code": 503, "message": "injected by gcs_emulator --fail_rate"}}'
      client.sendall(b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n%s" % (len(payload), payload))
      return True
    forward = {k: v for k, v in headers.items()
               if k.lower() not in ("transfer-encoding", "proxy-connection", "connection", "content-length", "expect")}
    # The Host header stays the Google host: fake-gcs routes XML-API downloads by it (-public-host).
    upstream.request(method, target, body=body if body or method in ("POST", "PUT", "PATCH") else None,
                     headers=forward)
    response = upstream.getresponse()
    if session and body and method == "PUT" and response.status in (200, 201):
      self.server.uploads.completed(session)
    local = f"{self.server.upstream[0]}:{self.server.upstream[1]}"
    length = response.getheader("content-length")
    # Stream large bodies (object reads) instead of buffering them: the client gets bytes sooner.
    stream = method != "HEAD" and length is not None and int(length) > _STREAM_ABOVE
    payload = b"" if stream else response.read()
    out = [f"HTTP/1.1 {response.status} {response.reason}\r\n".encode("latin-1")]
    for key, value in response.getheaders():
      if key.lower() in ("transfer-encoding", "content-length", "connection"):
        continue
      if key.lower() == "location":
        value = _https_location(value, local, host)
      out.append(f"{key}: {value}\r\n".encode("latin-1"))
    size = int(length) if stream else (0 if method == "HEAD" else len(payload))
    out.append(b"Content-Length: %d\r\n\r\n" % size)
    client.sendall(b"".join(out) + (b"" if method == "HEAD" else payload))
    if stream:
      while True:
        chunk = response.read(_STREAM_CHUNK)
        if not chunk:
          break
        client.sendall(chunk)
    return headers.get("connection", "").lower() != "close"


def _https_location(location: str, upstream: str, host: str) -> str:
  """fake-gcs answers resumable uploads with an http:// session URL (its own address or the Host it was
  asked for); TF must resume on https through the proxy, so point it back at the https Google host."""
  parsed = urllib.parse.urlsplit(location)
  if parsed.scheme == "http" and (parsed.netloc == upstream or parsed.hostname in GOOGLE_HOSTS):
    return urllib.parse.urlunsplit(("https", host, parsed.path, parsed.query, parsed.fragment))
  return location


def _read_headers(reader) -> dict[str, str]:
  headers = {}
  while True:
    line = reader.readline(65537).decode("latin-1")
    if line in ("\r\n", "\n", ""):
      return headers
    key, _, value = line.partition(":")
    headers[key.strip().lower()] = value.strip()


def _read_body(reader, headers: dict[str, str]) -> bytes:
  if "chunked" in headers.get("transfer-encoding", "").lower():
    chunks = []
    while True:
      size = int(reader.readline().split(b";")[0].strip() or b"0", 16)
      if size == 0:
        while reader.readline() not in (b"\r\n", b"\n", b""):
          pass
        return b"".join(chunks)
      chunks.append(reader.read(size))
      reader.readline()
  length = int(headers.get("content-length", "0") or 0)
  return reader.read(length) if length else b""


def serve_proxy(port: int, upstream_port: int, cert: str, key: str, fail_rate: float, seed: int,
                ready_file: str | None) -> None:
  tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
  tls.load_cert_chain(cert, key)
  faults = _Faults(fail_rate, seed)
  server = _ProxyServer(port, ("127.0.0.1", upstream_port), tls, faults)

  def report(*_):
    sys.stderr.write(json.dumps({"forwarded": faults.forwarded, "injected": faults.injected}) + "\n")
    sys.stderr.flush()

  def stop(*_):
    report()
    threading.Thread(target=server.shutdown, daemon=True).start()

  signal.signal(signal.SIGTERM, stop)
  signal.signal(signal.SIGUSR1, report)
  if ready_file:
    with open(ready_file + ".tmp", "w") as f:
      f.write(str(server.server_address[1]))
    os.replace(ready_file + ".tmp", ready_file)
  server.serve_forever(poll_interval=0.2)
  server.server_close()


def main(argv: list[str] | None = None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--port", type=int, default=0)
  parser.add_argument("--upstream_port", type=int, required=True)
  parser.add_argument("--cert", required=True)
  parser.add_argument("--key", required=True)
  parser.add_argument("--fail_rate", type=float, default=0.0)
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--ready_file")
  args = parser.parse_args(argv)
  serve_proxy(args.port, args.upstream_port, args.cert, args.key, args.fail_rate, args.seed, args.ready_file)


if __name__ == "__main__":
  main()
