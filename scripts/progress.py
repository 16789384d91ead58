"""Progress of a tool's long work (staging files to a bucket, a local batch prediction), reported as the trainer
reports its steps: a bar on a terminal (tqdm), a log line every `every_secs` elsewhere (a CI log, Vertex's log
viewer, a pipe). Work shorter than `every_secs` prints nothing off a terminal, so quick calls stay quiet.

    with Progress(total=len(names), what="staging", unit="file") as progress:
      for batch in batches:
        upload(batch)
        progress.advance(len(batch))
"""

from __future__ import annotations

import sys
import time
from typing import Callable, TextIO


class Progress:
  """`total` may be None (a stream of unknown length): then the lines give the count and the rate only."""

  def __init__(self, *, total: int | None, what: str, unit: str, stream: TextIO | None = None,
               interactive: bool | None = None, every_secs: float = 10.0,
               clock: Callable[[], float] = time.monotonic):
    self._stream = stream or sys.stderr
    self._total, self._what, self._unit, self._every = total, what, unit, every_secs
    self._clock = clock
    self._start = self._last = clock()
    self.done = 0
    if interactive is None:
      interactive = hasattr(self._stream, "isatty") and self._stream.isatty()
    self._bar = None
    if interactive:
      from tqdm import tqdm  # pylint: disable=g-import-not-at-top

      self._bar = tqdm(total=total, desc=what, unit=f" {unit}s", file=self._stream, leave=True)

  def __enter__(self) -> "Progress":
    return self

  def __exit__(self, *exc_info) -> None:
    self.close(finished=exc_info[0] is None)

  def advance(self, count: int = 1) -> None:
    self.done += count
    if self._bar is not None:
      self._bar.update(count)
      return
    now = self._clock()
    if now - self._last >= self._every:
      self._last = now
      self._write(self.line())

  def close(self, *, finished: bool = True) -> None:
    if self._bar is not None:
      self._bar.close()
      self._bar = None
    elif finished and self._clock() - self._start >= self._every:  # long work ends with its total
      self._write(self.line())

  def line(self) -> str:
    elapsed = self._clock() - self._start
    rate = self.done / elapsed if elapsed > 0 else 0.0
    units = f"{self._unit}s" if self.done != 1 else self._unit
    if self._total is None:
      return f"{self._what}: {self.done} {units}, {rate:.1f}/s, {elapsed:.0f} s"
    percent = 100 * self.done // self._total if self._total else 100
    left = (self._total - self.done) / rate if rate > 0 else float("nan")
    return (f"{self._what}: {self.done}/{self._total} {self._unit}s ({percent}%), {rate:.1f}/s, "
            f"{elapsed:.0f} s, about {left:.0f} s left")

  def _write(self, text: str) -> None:
    self._stream.write(text + "\n")
    self._stream.flush()
