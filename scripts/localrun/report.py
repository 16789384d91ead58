"""The end-of-job summary: replicas, roles, exit codes, run times, restarts and the artifacts in the bucket."""

from __future__ import annotations

import time

from scripts.localrun.planning import Replica


def summary(replicas: list[Replica], artifacts: list[str]) -> str:
  lines = [f"{'replica':<16}{'role':<11}{'exit':>5}{'seconds':>9}{'restarts':>9}"]
  for r in replicas:
    seconds = (r.ended or time.monotonic()) - r.started if r.started else 0
    exit_code = "-" if r.exit_code is None else ("stopped" if r.exit_code < 0 else str(r.exit_code))
    lines.append(f"{r.name:<16}{r.task_type:<11}{exit_code:>5}{seconds:>9.1f}{r.restarts:>9}")
  if artifacts:
    lines.append("artifacts:")
    lines.extend(f"  {a}" for a in artifacts)
  return "\n".join(lines)


def tail(path: str, lines: int = 15) -> str:
  with open(path, errors="replace") as f:
    return "".join(f.readlines()[-lines:])
