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
                                   "--train_steps=60", "--global_batch_size=32", "--profile_steps=10,20",
                                   f"--loop={loop}", "--eval_steps=0"])
  assert result.returncode == 0, result.stderr[-3000:]
  # With the default --steps_per_loop (50) both loops end a chunk (fit: an execution) at 10 and at 20, so the
  # trace holds exactly steps 11-20.
  assert f"Profiler: traced steps 11-20 into {out}/logs/plugins/profile/" in result.stderr, result.stderr[-3000:]
  (xplane,) = glob.glob(str(out / "logs" / "plugins" / "profile" / "*" / "*.xplane.pb"))
  names = {event.get("name", "") for event in _trace_events(xplane)}
  assert "Iterator::TFRecord" in names  # the input pipeline's reads of those steps, on the host's timeline


def test_a_window_from_step_0_one_a_resume_has_passed_and_one_past_the_end(churn_data, tmp_path):
  """START 0 traces from the first step; a run resumed past the window, or ending before it, traces nothing and
  says so (a newcomer saw a resumed run trace steps 251-300 for --profile_steps=10,20)."""
  out = tmp_path / "out"
  args = [f"--train_data={churn_data}/train/*.tfrecord", f"--output_dir={out}", "--global_batch_size=32",
          "--eval_steps=0", "--profile_steps=0,10"]
  first = procs.run_trainer_here(args + ["--train_steps=20", "--checkpoint_every_steps=20"])
  assert first.returncode == 0 and "Profiler: traced steps 1-10 into " in first.stderr, first.stderr[-3000:]
  resumed = procs.run_trainer_here(args + ["--train_steps=40"])
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  assert "Profiler: steps 1-10 were trained before step 20, where this run resumed: nothing is traced" in \
      resumed.stderr and "Profiler: traced" not in resumed.stderr
  late = procs.run_trainer_here(args[:-1] + [f"--output_dir={tmp_path}/late", "--train_steps=30",
                                             "--profile_steps=100,200"])
  assert late.returncode == 0 and "Profiler: --profile_steps=100,200 starts at or after the final step 30: nothing " \
      "is traced" in late.stderr, late.stderr[-3000:]
  assert len(glob.glob(str(out / "logs" / "plugins" / "profile" / "*" / "*.xplane.pb"))) == 1  # the first run's
  assert not glob.glob(str(tmp_path / "late" / "logs" / "plugins" / "profile"))


def test_a_window_that_is_not_two_ascending_steps_is_one_line(churn_data, tmp_path):
  for value in ("20,10", "10", "-1,5"):
    result = procs.run_trainer_here([f"--train_data={churn_data}/train/*.tfrecord", f"--output_dir={tmp_path}/out",
                                     f"--profile_steps={value}"])
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert result.returncode == 2 and errors == [
        f"error: --profile_steps must be START,END: two steps with 0 <= START < END (e.g. 10,20), got "
        f"{[int(v) for v in value.split(',')]}"], result.stderr[-2000:]
    assert not (tmp_path / "out").exists()
