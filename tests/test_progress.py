"""Progress lines (what Vertex's log viewer shows), pinned with an injected clock."""

import pytest

from trainer.core import progress

# The quick tier (scripts/test.sh --quick): no test here trains for long or waits on peers.
pytestmark = pytest.mark.quick


def test_log_line_is_exact():
  now = [100.0]
  reporter = progress.ProgressReporter(1000, start_step=200, interactive=False, clock=lambda: now[0])
  now[0] = 110.0  # 10 s for 100 steps -> 10 steps/s, 800 steps left at step 300 -> 70 s
  line = reporter.line(300, {"loss": 0.123456, "learning_rate": 0.001, "examples_per_sec": 2560.0})
  assert line == "step 300/1000 (30%) loss=0.1235 learning_rate=0.001 examples_per_sec=2560 eta=70s"
