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


# --- the tools' progress (scripts/progress.py): staging, batch prediction ----------------------------------------


def _tool_progress(total, now, **kwargs):
  import io  # pylint: disable=g-import-not-at-top

  from scripts import progress as tool_progress  # pylint: disable=g-import-not-at-top

  stream = io.StringIO()
  return tool_progress.Progress(total=total, what="staging", unit="file", stream=stream, clock=lambda: now[0],
                                **kwargs), stream


def test_long_work_off_a_terminal_is_a_line_every_interval_and_one_at_the_end():
  now = [0.0]
  reporter, stream = _tool_progress(100, now)
  reporter.advance(10)
  now[0] = 5.0
  reporter.advance(10)  # 5 s in: not yet
  now[0] = 12.0
  reporter.advance(10)  # 30 files in 12 s: 2.5/s, 70 left -> 28 s
  now[0] = 20.0
  reporter.advance(70)
  reporter.close()
  assert stream.getvalue().splitlines() == [
      "staging: 30/100 files (30%), 2.5/s, 12 s, about 28 s left",
      "staging: 100/100 files (100%), 5.0/s, 20 s, about 0 s left"]


def test_quick_work_off_a_terminal_prints_nothing_and_a_stream_of_unknown_length_counts():
  now = [0.0]
  reporter, stream = _tool_progress(5, now)
  reporter.advance(5)
  now[0] = 1.0
  reporter.close()
  assert stream.getvalue() == ""
  reporter, stream = _tool_progress(None, now, every_secs=0)
  reporter.advance(1)
  now[0] = 3.0
  reporter.advance(2)
  assert stream.getvalue().splitlines()[-1] == "staging: 3 files, 1.5/s, 2 s"  # since the start at 1.0


def test_on_a_terminal_it_is_a_bar():
  reporter, stream = _tool_progress(40, [0.0], interactive=True)
  for _ in range(4):
    reporter.advance(10)
  reporter.close()
  assert "staging: 100%" in stream.getvalue() and "40/40" in stream.getvalue()


def test_staging_reports_each_batch_of_files(gcs, tmp_path):
  import io  # pylint: disable=g-import-not-at-top

  from scripts import progress as tool_progress  # pylint: disable=g-import-not-at-top
  from scripts import stage_data  # pylint: disable=g-import-not-at-top

  for i in range(70):
    (tmp_path / f"part-{i:03d}.txt").write_text(str(i))
  stream = io.StringIO()
  reporter = tool_progress.Progress(total=70, what="staging", unit="file", stream=stream, every_secs=0)
  uris = stage_data.upload_tree(str(tmp_path), "gs://test-bucket/progress", workers=2, progress=reporter)
  assert len(uris) == 70
  # Batches of 32 files (4 per worker, at least 32), then the total once more at the end.
  assert [line.split(" files")[0] for line in stream.getvalue().splitlines()] == [
      "staging: 32/70", "staging: 64/70", "staging: 70/70", "staging: 70/70"]
