"""The end-of-job summary: replicas, roles, exit codes, run times, restarts, preemptions (the step each saved
and the step its restart resumed at, read from the replica's log) and the artifacts in the bucket."""

from __future__ import annotations

import re
import time

from scripts.localrun.planning import Preemption
from scripts.localrun.planning import Replica


def preemption_line(p: Preemption, log_text: str) -> str:
  """One preemption: when, how the replica ended, the step it saved and the step its restart resumed at."""
  if p.sent is None:
    return f"  {p.replica} @ {p.when}: not sent (the job, or the replica, had ended by then)"
  if not p.done:
    return f"  {p.replica} @ {p.when}: SIGTERM sent; the job ended before the replica did"
  ended = "SIGKILLed after the grace" if p.killed else f"exit {p.exit_code} after {p.exit_secs:.1f} s"
  stop = log_text[p.log_offset:p.restart_offset]
  saved = re.findall(r"saved checkpoint \S+ at step (\d+)", stop)
  resumed = re.findall(r"Resuming at step (\d+)|training is done|has nothing left to do",
                       log_text[p.restart_offset:] if p.restart_offset is not None else "")
  saved_text = f"saved step {saved[-1]}" if saved else "saved nothing"
  resumed_text = (f"resumed at step {resumed[0]}" if resumed and resumed[0] else
                  "restart found training done" if resumed else "restart did not resume from a checkpoint")
  return f"  {p.replica} @ {p.when}: {ended}, {saved_text}; {resumed_text}"


def summary(replicas: list[Replica], artifacts: list[str], preemptions: list[Preemption] = ()) -> str:
  lines = [f"{'replica':<16}{'role':<11}{'exit':>5}{'seconds':>9}{'restarts':>9}"]
  for r in replicas:
    seconds = (r.ended or time.monotonic()) - r.started if r.started else 0
    exit_code = "-" if r.exit_code is None else ("stopped" if r.exit_code < 0 else str(r.exit_code))
    lines.append(f"{r.name:<16}{r.task_type:<11}{exit_code:>5}{seconds:>9.1f}{r.restarts:>9}")
  if preemptions:
    logs = {r.name: _read(r.log_path) for r in replicas}
    lines.append("preemptions:")
    lines.extend(preemption_line(p, logs.get(p.replica, "")) for p in preemptions)
  if artifacts:
    lines.append("artifacts:")
    lines.extend(f"  {a}" for a in artifacts)
  return "\n".join(lines)


def _read(path: str) -> str:
  try:
    with open(path, errors="replace") as f:
      return f.read()
  except OSError:
    return ""


def tail(path: str, lines: int = 15) -> str:
  with open(path, errors="replace") as f:
    return "".join(f.readlines()[-lines:])
