"""The emulated bucket as a user's shell uses it: `eval "$(... start)"` then `eval "$(... stop)"` (or `env-unset`)
leaves no emulator variable behind; `cp` copies files and folders byte for byte with gcloud's naming; every bad
argument is one `error:` line with exit 2; local_vertex refuses a STORAGE_EMULATOR_HOST that does not answer
before anything is built.

Each test that starts an emulator keeps its state in its own tmp dir (GCS_EMULATOR_STATE_DIR), never in the repo's
.emulator/: a user's running emulator and the other xdist worker are left alone."""

import gzip
import io
import json
import os
import re
import shlex
import socket
import subprocess
import sys
import threading

import pandas as pd
import pytest

import procs
from scripts import gcs_emulator
from scripts.emulator import copy as copy_lib
from scripts.emulator import process

# The quick tier (scripts/test.sh --quick): no test here trains for long or waits on peers.
pytestmark = pytest.mark.quick

# What `start` exports, from the emulator's own table (the placeholder has no ports; only the names count).
EMULATOR_VARIABLES = frozenset(process.Emulator(gcs_port=0, proxy_port=0, directory="", pids=[], ca_path="").env)
CLI = [sys.executable, "-m", "scripts.gcs_emulator"]


def _env(state_dir=None, **extra: str) -> dict[str, str]:
  """A user's shell before `start`: no emulator variable (this process may hold the session emulator's), only the
  loopback guards every test process keeps."""
  env = {k: v for k, v in procs.trainer_env().items()
         if k not in EMULATOR_VARIABLES and k != gcs_emulator.STATE_DIR_VARIABLE}
  env.update(procs.SAFE_ENV)
  if state_dir is not None:
    env[gcs_emulator.STATE_DIR_VARIABLE] = str(state_dir)
  env.update(extra)
  return env


def _run(argv: list[str], env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess:
  return subprocess.run(argv, env=env, cwd=procs.REPO, capture_output=True, text=True, timeout=timeout, check=False)


def _dead_host() -> str:
  """A STORAGE_EMULATOR_HOST nobody listens on."""
  return f"http://127.0.0.1:{procs.free_ports(1)[0]}"


def _names(lines: str, verb: str) -> list[str]:
  names = []
  for line in lines.splitlines():
    match = re.fullmatch(rf"{verb} ([A-Za-z_][A-Za-z0-9_]*)(=.*)?", line)
    assert match, f"not a `{verb}` line: {line!r}"
    names.append(match.group(1))
  return names


def _variables(env_dump: str) -> set[str]:
  return {line.partition("=")[0] for line in env_dump.splitlines() if "=" in line} & EMULATOR_VARIABLES


def test_a_shell_started_then_stopped_keeps_no_emulator_variable(tmp_path):
  """The round trip a user types: start, copy through the shell's variables, env-unset (stops nothing), stop. What
  `stop` unsets is exactly what `start` exported, and the emulator is gone after it."""
  state = tmp_path / "state"
  (tmp_path / "rows.csv").write_text("a,b\n1,2\n")
  py = shlex.quote(sys.executable)
  script = f"""
set -euo pipefail
started=$({py} -m scripts.gcs_emulator start --bucket shell-bucket)
printf '%s\\n' "$started" > start.out
eval "$started"
env > started.env
{py} -m scripts.gcs_emulator cp rows.csv gs://shell-bucket/in/
{py} -m scripts.gcs_emulator env-unset > env-unset.out
eval "$(cat env-unset.out)"
env > unset.env
{py} -m scripts.gcs_emulator env > env.out   # still running: env-unset stopped nothing
eval "$(cat env.out)"
cp {shlex.quote(str(state))}/state.json state.json
stopped=$({py} -m scripts.gcs_emulator stop)
printf '%s\\n' "$stopped" > stop.out
eval "$stopped"
env > stopped.env
"""
  result = subprocess.run(["bash", "-c", script], env=_env(state), cwd=tmp_path, capture_output=True, text=True,
                          timeout=120, check=False)
  assert result.returncode == 0, result.stderr[-3000:]
  assert re.fullmatch(r"copied 1 file \(8 bytes\) to gs://shell-bucket/in/rows\.csv\n", result.stdout), result.stdout
  exported = _names((tmp_path / "start.out").read_text(), "export")
  assert set(exported) == EMULATOR_VARIABLES and len(exported) == len(EMULATOR_VARIABLES)
  assert {"all_proxy", "https_proxy", "STORAGE_EMULATOR_HOST", "CURL_CA_BUNDLE",
          "GOOGLE_AUTH_TOKEN_FOR_TESTING"} <= set(exported)
  # `stop` puts the shell back: the loopback guards this shell had before `start` are exported again, the rest
  # unset; `env-unset` unsets everything.
  had = set(procs.SAFE_ENV) & EMULATOR_VARIABLES
  assert had == {"GCE_METADATA_HOST", "GCE_METADATA_IP", "NO_GCE_CHECK"}
  stop_lines = (tmp_path / "stop.out").read_text().splitlines()
  assert [line.split()[1].split("=")[0] for line in stop_lines] == exported
  assert set(_names("\n".join(l for l in stop_lines if l.startswith("unset")), "unset")) == set(exported) - had
  assert set(_names("\n".join(l for l in stop_lines if l.startswith("export")), "export")) == had
  assert _names((tmp_path / "env-unset.out").read_text(), "unset") == exported
  assert _variables((tmp_path / "started.env").read_text()) == EMULATOR_VARIABLES
  assert _variables((tmp_path / "unset.env").read_text()) == set()
  assert _variables((tmp_path / "stopped.env").read_text()) == had
  # The emulator was still there for `env` after env-unset, and is gone after stop (its state file too).
  assert _names((tmp_path / "env.out").read_text(), "export") == exported
  ran = process.Emulator(**json.loads((tmp_path / "state.json").read_text()))
  assert process.unanswered(ran.env["STORAGE_EMULATOR_HOST"]) is not None
  assert not (state / "state.json").exists()


def test_stop_puts_back_what_the_shell_had_before_start(tmp_path):
  """A user behind a corporate proxy, with their own CA bundle and metadata guard: `stop` exports their values
  again (the emulator's are gone) and unsets only what they did not have."""
  own = {"https_proxy": "http://proxy.corp.example:3128", "NO_PROXY": ".corp.example",
         "CURL_CA_BUNDLE": "/etc/ssl/corp bundle.pem"}  # a space: the value is quoted for the shell
  py = shlex.quote(sys.executable)
  script = f"""
set -euo pipefail
eval "$({py} -m scripts.gcs_emulator start --bucket b1)"
env > started.env
stopped=$({py} -m scripts.gcs_emulator stop)
printf '%s\\n' "$stopped" > stop.out
eval "$stopped"
env > stopped.env
"""
  result = subprocess.run(["bash", "-c", script], env=_env(tmp_path / "state", **own), cwd=tmp_path,
                          capture_output=True, text=True, timeout=120, check=False)
  assert result.returncode == 0, result.stderr[-3000:]
  started = dict(line.split("=", 1) for line in (tmp_path / "started.env").read_text().splitlines() if "=" in line)
  assert started["https_proxy"].startswith("http://127.0.0.1:") and started["CURL_CA_BUNDLE"] != own["CURL_CA_BUNDLE"]
  stopped = dict(line.split("=", 1) for line in (tmp_path / "stopped.env").read_text().splitlines() if "=" in line)
  assert {name: stopped.get(name) for name in own} == own
  had = set(own) | (set(procs.SAFE_ENV) & EMULATOR_VARIABLES)  # and the loopback guards every test shell has
  assert _variables((tmp_path / "stopped.env").read_text()) == had
  lines = (tmp_path / "stop.out").read_text().splitlines()
  assert set(_names("\n".join(l for l in lines if l.startswith("export")), "export")) == had
  assert set(_names("\n".join(l for l in lines if l.startswith("unset")), "unset")) == EMULATOR_VARIABLES - had


def test_stop_with_nothing_running_still_unsets_a_stale_shell(tmp_path):
  """A shell that kept a gone emulator's variables (a reboot, `stop` from another shell) is cleaned by `stop`,
  which says on stderr that nothing was running."""
  stale = process.Emulator(gcs_port=procs.free_ports(1)[0], proxy_port=9, directory=str(tmp_path), pids=[],
                           ca_path=str(tmp_path / "ca.pem"))
  py = shlex.quote(sys.executable)
  script = f'{stale.exports()}eval "$({py} -m scripts.gcs_emulator stop)"\nenv > stopped.env\n'
  result = subprocess.run(["bash", "-c", script], env=_env(tmp_path / "state"), cwd=tmp_path, capture_output=True,
                          text=True, timeout=60, check=False)
  assert result.returncode == 0, result.stderr
  assert result.stderr == f"no emulator is running (no {tmp_path}/state/state.json; nothing to stop)\n"
  assert _variables((tmp_path / "stopped.env").read_text()) == set()
  stop = _run(CLI + ["stop"], _env(tmp_path / "state"))
  assert (stop.returncode, stop.stdout) == (0, process.Emulator.unsets())


def _write_tree(root) -> dict[str, bytes]:
  """A user's data folder: pandas CSV (quotes, commas, newlines, non-ASCII, blanks), its gzip, binary files large
  (a resumable upload) and empty, nested folders, a name with a space. Returns relative name -> bytes."""
  frame = pd.DataFrame({"city": ["Zürich", 'Rio "de" Janeiro', "a, b", "two\nlines", None],
                        "value": [1.5, float("nan"), -3.0, 1e-12, 7.0], "label": ["yes", "no", "no", "yes", "no"]})
  data = root / "data"
  (data / "nested" / "deeper").mkdir(parents=True)
  (data / "with space").mkdir()
  frame.to_csv(data / "train.csv", index=False)
  frame.to_csv(data / "nested" / "part-00000.csv.gz", index=False, compression="gzip")
  (data / "nested" / "deeper" / "weights.bin").write_bytes(os.urandom(9 * 1024 * 1024 + 17))
  (data / "nested" / "deeper" / "empty.bin").write_bytes(b"")
  (data / "with space" / "ünïcode name.txt").write_bytes(bytes(range(256)) * 4)
  return {str(p.relative_to(data)).replace(os.sep, "/"): p.read_bytes() for p in data.rglob("*") if p.is_file()}


def _objects(gcs, prefix: str) -> dict[str, bytes]:
  client = gcs.storage_client()
  found = {}
  for blob in client.list_blobs("test-bucket", prefix=prefix):
    assert blob.content_encoding is None  # nothing a reader would see decompressed: the bytes as written
    found[blob.name[len(prefix):]] = blob.download_as_bytes(raw_download=True)
  return found


def test_cp_copies_files_and_folders_byte_for_byte(gcs, tmp_path):
  tree = _write_tree(tmp_path)
  data = tmp_path / "data"
  total = sum(len(b) for b in tree.values())
  base = f"cp-{tmp_path.name}"
  env = _env(**gcs.env)

  # A folder lands under the destination with its own name, with or without a trailing '/' on either side.
  for i, (source, destination) in enumerate([(str(data), f"gs://test-bucket/{base}/a/x"),
                                             (f"{data}/", f"gs://test-bucket/{base}/b/x/")]):
    result = _run(CLI + ["cp", "-r", source, destination], env)
    assert result.returncode == 0, result.stderr
    prefix = f"{base}/{'ab'[i]}/x/data/"
    assert result.stdout == f"copied 5 files ({copy_lib.human_size(total)}) to gs://test-bucket/{prefix}\n"
    assert len(tree) == 5 and result.stdout.startswith("copied 5 files (9.4 MB)")
    assert _objects(gcs, prefix) == tree
  assert pd.read_csv(io.BytesIO(_objects(gcs, f"{base}/a/x/data/")["train.csv"])).equals(
      pd.read_csv(data / "train.csv"))
  assert gzip.decompress(tree["nested/part-00000.csv.gz"]) == tree["train.csv"]

  # One file: at the exact name, or under a destination ending in '/' with its own name.
  result = _run(CLI + ["cp", str(data / "train.csv"), f"gs://test-bucket/{base}/renamed.csv"], env)
  assert result.returncode == 0, result.stderr
  assert result.stdout.endswith(f"to gs://test-bucket/{base}/renamed.csv\n")
  result = _run(CLI + ["cp", str(data / "nested" / "part-00000.csv.gz"), f"gs://test-bucket/{base}/one/"], env)
  assert result.returncode == 0, result.stderr
  assert _objects(gcs, f"{base}/one/") == {"part-00000.csv.gz": tree["nested/part-00000.csv.gz"]}
  assert _objects(gcs, f"{base}/renamed.csv") == {"": tree["train.csv"]}

  # Several sources: each under the destination, a line for each, then the total.
  result = _run(CLI + ["cp", str(data / "train.csv"), str(data / "with space"), f"gs://test-bucket/{base}/many"],
                env)
  assert result.returncode == 0, result.stderr
  assert result.stdout.splitlines() == [
      f"{data / 'train.csv'} -> gs://test-bucket/{base}/many/train.csv (1 file, "
      f"{copy_lib.human_size(len(tree['train.csv']))})",
      f"{data / 'with space'} -> gs://test-bucket/{base}/many/with space/ (1 file, 1.0 kB)",
      f"copied 2 files ({copy_lib.human_size(len(tree['train.csv']) + 1024)}) to gs://test-bucket/{base}/many/"]
  assert _objects(gcs, f"{base}/many/") == {"train.csv": tree["train.csv"],
                                            "with space/ünïcode name.txt": tree["with space/ünïcode name.txt"]}


@pytest.mark.parametrize("source,destination,line", [
    ("absent.csv", "gs://test-bucket/x/", "error: LOCAL 'absent.csv': no such file or folder"),
    ("rows.csv", "s3://test-bucket/x",
     "error: DESTINATION 's3://test-bucket/x': expected gs://BUCKET[/PATH] as the last argument (cp copies into a "
     "bucket)"),
    ("rows.csv", "copy.csv",
     "error: DESTINATION 'copy.csv': expected gs://BUCKET[/PATH] as the last argument (cp copies into a bucket)"),
    ("rows.csv", "gs://Test_Bucket/x",
     "error: DESTINATION 'gs://Test_Bucket/x': 'Test_Bucket' is not a bucket name (3-63 lowercase letters, digits, "
     "'-', '_' or '.', starting and ending with a letter or digit); expected gs://BUCKET[/PATH] as the last argument"),
    ("rows.csv", "gs://",
     "error: DESTINATION 'gs://': '' is not a bucket name (3-63 lowercase letters, digits, '-', '_' or '.', starting "
     "and ending with a letter or digit); expected gs://BUCKET[/PATH] as the last argument"),
    ("rows.csv", "gs://test-bucket/a//b",
     "error: DESTINATION 'gs://test-bucket/a//b': an object path has no empty, '.' or '..' parts; expected "
     "gs://BUCKET[/PATH] as the last argument"),
    ("rows.csv", "gs://no-such-bucket/x",
     "error: DESTINATION 'gs://no-such-bucket/x': there is no bucket 'no-such-bucket' (the emulator makes buckets at "
     "start: python -m scripts.gcs_emulator start --bucket no-such-bucket)"),
    ("rows.csv other/rows.csv", "gs://test-bucket/x/",
     "error: LOCAL 'rows.csv' and 'other/rows.csv' would both be copied to gs://test-bucket/x/rows.csv: copy them in "
     "separate commands"),
    ("rows.csv", "dead:gs://test-bucket/x",
     "error: STORAGE_EMULATOR_HOST={host} does not answer (connection refused); start the emulator (eval \"$(python "
     "-m scripts.gcs_emulator start --bucket test-bucket)\") or unset the variables (eval \"$(python -m "
     "scripts.gcs_emulator env-unset)\")"),
])
def test_cp_refuses_in_one_line(gcs, tmp_path, source, destination, line):
  (tmp_path / "rows.csv").write_text("a,b\n1,2\n")
  (tmp_path / "other").mkdir()
  (tmp_path / "other" / "rows.csv").write_text("a,b\n3,4\n")
  env = _env(**gcs.env)
  if destination.startswith("dead:"):
    destination = destination[len("dead:"):]
    env["STORAGE_EMULATOR_HOST"] = _dead_host()
  result = subprocess.run(CLI + ["cp", *source.split(), destination], env=env, cwd=tmp_path, capture_output=True,
                          text=True, timeout=60, check=False)
  assert (result.returncode, result.stdout) == (2, "")
  assert result.stderr.splitlines() == [line.format(host=env["STORAGE_EMULATOR_HOST"])]
  assert not list(gcs.storage_client().list_blobs("test-bucket", prefix="x/"))  # nothing half-copied


def test_local_vertex_refuses_an_emulator_host_that_does_not_answer(tmp_path):
  """A shell that kept a stopped emulator's variables: one line, exit 2, before anything is built or started (and
  before TensorFlow is imported: the refusal takes a second, not a minute of retries)."""
  host = _dead_host()
  job_dir = tmp_path / "job"
  code = ("import sys\nfrom scripts import local_vertex\ncode = local_vertex.main(sys.argv[1:])\n"
          "print(sorted({m.split('.')[0] for m in sys.modules} & {'tensorflow', 'keras', 'tf_keras'}))\n"
          "sys.exit(code)\n")
  result = _run([sys.executable, "-c", code, "--config=cloud_configs/single_cpu.yaml", "--bucket=my-bucket",
                 f"--job_dir={job_dir}"], _env(STORAGE_EMULATOR_HOST=host), timeout=60)
  assert result.returncode == 2, result.stderr
  assert result.stderr.splitlines() == [
      f"error: STORAGE_EMULATOR_HOST={host} does not answer (connection refused); start the emulator (eval \"$(python "
      "-m scripts.gcs_emulator start --bucket my-bucket)\") or unset the variables (eval \"$(python -m "
      "scripts.gcs_emulator env-unset)\")"]
  assert result.stdout == "[]\n"  # no TensorFlow
  assert os.listdir(job_dir) == []  # no sdist, no installed package, no emulator of its own


def test_unanswered_tells_a_silent_or_foreign_port_from_an_emulator(gcs):
  """The probe's reasons: a port that accepts but never answers, one that answers but not HTTP, a value that is
  not a URL; the running emulator (with or without its scheme) answers."""
  assert process.unanswered(gcs.env["STORAGE_EMULATOR_HOST"]) is None
  assert process.unanswered(f"127.0.0.1:{gcs.gcs_port}") is None
  with socket.socket() as server:  # accepts (the kernel does), never answers
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    silent = process.unanswered(f"http://127.0.0.1:{server.getsockname()[1]}", timeout=0.3)
  assert silent and "(no answer within 0.3 s)" in silent
  with socket.socket() as server:  # answers, as an SSH server would
    server.bind(("127.0.0.1", 0))
    server.listen(1)

    def talk() -> None:
      connection, _ = server.accept()
      with connection:
        connection.sendall(b"SSH-2.0-OpenSSH_9.6\r\n")

    talker = threading.Thread(target=talk, daemon=True)
    talker.start()
    foreign = process.unanswered(f"http://127.0.0.1:{server.getsockname()[1]}", timeout=5)
    talker.join(timeout=5)
  assert foreign and "(the port answers, but not as an HTTP server)" in foreign
  bad = process.unanswered("ftp://127.0.0.1:21", buckets=("b1x", "b2x"))
  assert bad and bad.startswith("STORAGE_EMULATOR_HOST=ftp://127.0.0.1:21 does not answer (expected http://HOST:PORT)")
  assert "start --bucket b1x --bucket b2x" in bad


@pytest.mark.parametrize("sources,destination,expected", [
    (["data"], "gs://bkt/x", ["x/data/a.csv", "x/data/sub/b.bin"]),
    (["data/"], "gs://bkt/x/", ["x/data/a.csv", "x/data/sub/b.bin"]),
    (["data"], "gs://bkt", ["data/a.csv", "data/sub/b.bin"]),
    (["data/a.csv"], "gs://bkt/x", ["x"]),
    (["data/a.csv"], "gs://bkt/x/", ["x/a.csv"]),
    (["data/a.csv"], "gs://bkt/", ["a.csv"]),
    (["data/a.csv", "data/sub"], "gs://bkt/x", ["x/a.csv", "x/sub/b.bin"]),
])
def test_cp_names_objects_as_gcloud_storage_cp(tmp_path, monkeypatch, sources, destination, expected):
  (tmp_path / "data" / "sub").mkdir(parents=True)
  (tmp_path / "data" / "a.csv").write_text("a\n1\n")
  (tmp_path / "data" / "sub" / "b.bin").write_bytes(b"\0\1")
  monkeypatch.chdir(tmp_path)
  bucket, planned = copy_lib.plan(sources, destination)
  assert bucket == "bkt"
  assert [name for p in planned for _, name in p.files] == expected
