"""--profile_steps: a TensorFlow profiler trace of chosen training steps, under both loops, in the TensorBoard dir,
read back the way TensorBoard's Profile tab reads it (xprof, the tensorboard-plugin-profile backend)."""

import glob
import json

import pytest

import procs

pytestmark = pytest.mark.quick


def _trace_events(xplane: str) -> list[dict]:
  from xprof.convert import raw_to_tool_data  # pylint: disable=g-import-not-at-top

  assert {"overview_page", "input_pipeline_analyzer"} <= set(raw_to_tool_data.xspace_to_tool_names([xplane]))
  data, content_type = raw_to_tool_data.xspace_to_tool_data([xplane], "trace_viewer", {})
  assert content_type == "application/json"
  return json.loads(data)["traceEvents"]


@pytest.mark.parametrize("loop", ["custom", "fit"])
def test_a_trace_of_the_chosen_steps_lands_where_tensorboard_reads_it(churn_data, tmp_path, loop):
  out = tmp_path / "out"
  result = procs.run_trainer_here([f"--train_data={churn_data}/train/*.tfrecord", f"--output_dir={out}",
                                   "--train_steps=30", "--steps_per_loop=5", "--global_batch_size=32",
                                   "--profile_steps=10,20", f"--loop={loop}", "--eval_steps=0"])
  assert result.returncode == 0, result.stderr[-3000:]
  # Both loops fire their actions every 5 steps here, so the trace holds exactly steps 11-20.
  assert f"Profiler: traced steps 11-20 into {out}/logs/plugins/profile/" in result.stderr, result.stderr[-3000:]
  (xplane,) = glob.glob(str(out / "logs" / "plugins" / "profile" / "*" / "*.xplane.pb"))
  names = {event.get("name", "") for event in _trace_events(xplane)}
  assert "Iterator::TFRecord" in names  # the input pipeline's reads of those steps, on the host's timeline


def test_a_window_that_is_not_two_ascending_steps_is_one_line(churn_data, tmp_path):
  for value in ("20,10", "10", "-1,5"):
    result = procs.run_trainer_here([f"--train_data={churn_data}/train/*.tfrecord", f"--output_dir={tmp_path}/out",
                                     f"--profile_steps={value}"])
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert result.returncode == 2 and errors == [
        f"error: --profile_steps must be START,END: two steps with 0 <= START < END (e.g. 10,20), got "
        f"{[int(v) for v in value.split(',')]}"], result.stderr[-2000:]
    assert not (tmp_path / "out").exists()
