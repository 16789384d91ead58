"""Where the test suite's time goes: each test's wall time and CPU time, its own process's and its children's.

The suite is CPU-bound on two cores (most of it is TensorFlow processes: about 8 s of CPU each for a short run,
4 s of it importing TensorFlow), so the CPU a test costs, not its wall time beside other tests, says what it adds
to the suite's length. A pytest plugin records one JSON line per test; the report sums them by test and by file.

  .venv/bin/python -m pytest -p scripts.bench.suite -n 3 --dist worksteal   # records into $SUITE_PROFILE_DIR
  .venv/bin/python -m scripts.bench.suite [DIR] [--top=30]                  # the report

$SUITE_PROFILE_DIR defaults to /tmp/suite-profile (emptied by hand between runs). A child's CPU counts when it is
reaped: for the test that waits for it, or, for a child a test left behind, the test whose process reaps it later
(Python's subprocess reaps finished children at each new Popen: a test whose CPU passes its wall time twice over,
on two cores, holds another's); a server a session fixture keeps (the Cloud Storage emulator) counts for none.
"""

from __future__ import annotations

import argparse
import collections
import glob
import json
import os
import time

import pytest

DEFAULT_DIR = "/tmp/suite-profile"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):  # pylint: disable=unused-argument
  """Setup, call and teardown of one test: wall time and the CPU of this process and of its reaped children."""
  before, started = os.times(), time.monotonic()
  yield
  after, wall = os.times(), time.monotonic() - started
  record = {"test": item.nodeid, "wall": round(wall, 2),
            "cpu_self": round(after.user - before.user + after.system - before.system, 2),
            "cpu_children": round(after.children_user - before.children_user + after.children_system -
                                  before.children_system, 2)}
  directory = os.environ.get("SUITE_PROFILE_DIR", DEFAULT_DIR)
  os.makedirs(directory, exist_ok=True)
  with open(os.path.join(directory, f"tests.{os.getpid()}.jsonl"), "a") as f:  # one file per xdist worker
    f.write(json.dumps(record) + "\n")


def report(directory: str, top: int) -> str:
  records = [json.loads(line) for path in sorted(glob.glob(os.path.join(directory, "tests.*.jsonl")))
             for line in open(path)]
  if not records:
    return f"error: no records in {directory}: run pytest with -p scripts.bench.suite first"
  cpu = lambda r: r["cpu_self"] + r["cpu_children"]  # pylint: disable=unnecessary-lambda-assignment
  lines = [f"{len(records)} tests: {sum(r['wall'] for r in records):.0f} s of test time (summed over the test "
           f"processes), {sum(map(cpu, records)):.0f} s of CPU ({sum(r['cpu_children'] for r in records):.0f} s of "
           "it in child processes)", "", "| file | tests | CPU s | wall s |", "| --- | ---: | ---: | ---: |"]
  by_file = collections.defaultdict(list)
  for record in records:
    by_file[record["test"].split("::")[0]].append(record)
  for name, group in sorted(by_file.items(), key=lambda item: -sum(map(cpu, item[1])))[:top]:
    lines.append(f"| `{name}` | {len(group)} | {sum(map(cpu, group)):.0f} | {sum(r['wall'] for r in group):.0f} |")
  lines += ["", "| CPU s | wall s | test |", "| ---: | ---: | --- |"]
  for record in sorted(records, key=lambda r: -cpu(r))[:top]:
    lines.append(f"| {cpu(record):.1f} | {record['wall']:.1f} | `{record['test']}` |")
  return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("directory", nargs="?", default=os.environ.get("SUITE_PROFILE_DIR", DEFAULT_DIR))
  parser.add_argument("--top", type=int, default=30, help="rows per table")
  args = parser.parse_args(argv)
  text = report(args.directory, args.top)
  print(text)
  return 2 if text.startswith("error:") else 0


if __name__ == "__main__":
  raise SystemExit(main())
