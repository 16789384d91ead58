"""The outer loop's cadence, with a fake source and clock: pure Python, no TensorFlow."""

import pytest

from trainer.training import loop

# The quick tier (scripts/test.sh --quick): no test here trains for long or waits on peers.
pytestmark = pytest.mark.quick


class FakeClock:
  def __init__(self):
    self.now = 0.0

  def __call__(self):
    return self.now


def _run(start, total, *, max_steps_per_call, actions, secs_per_step=0.0, clock=None, stop_after=None):
  calls = []

  def advance(num):
    if stop_after is not None and sum(calls) >= stop_after:
      return 0, None
    calls.append(num)
    if clock is not None:
      clock.now += num * secs_per_step
    return num, float(sum(calls))

  return loop.run(start_step=start, total_steps=total, advance=advance, actions=actions,
                  max_steps_per_call=max_steps_per_call), calls


def test_chunks_stop_on_every_boundary_and_actions_fire_there():
  seen = {"log": [], "checkpoint": []}
  actions = [loop.PeriodicAction("log", lambda s: seen["log"].append(s.step), every_steps=20),
             loop.PeriodicAction("checkpoint", lambda s: seen["checkpoint"].append(s.step), every_steps=30)]
  state, calls = _run(0, 95, max_steps_per_call=25, actions=actions)
  assert calls == [20, 10, 10, 20, 20, 10, 5]  # never past 25, never across a multiple of 20 or 30, ends at 95
  assert seen == {"log": [20, 40, 60, 80, 95], "checkpoint": [30, 60, 90, 95]}  # and once more at the end
  assert state.step == 95 and state.loss == 95.0


def test_resume_keeps_the_cadence_of_absolute_steps():
  seen = []
  state, calls = _run(30, 70, max_steps_per_call=None,
                      actions=[loop.PeriodicAction("checkpoint", lambda s: seen.append(s.step), every_steps=25)])
  assert calls == [20, 20] and seen == [50, 70] and state.step == 70  # 50 is a multiple of 25; 75 is past the end


def test_time_cadence_fires_after_the_chunk_that_passes_it():
  clock = FakeClock()
  seen = []
  action = loop.PeriodicAction("preempt", lambda s: seen.append(s.step), every_secs=10, at_end=False, clock=clock)
  _run(0, 100, max_steps_per_call=10, actions=[action], secs_per_step=0.4, clock=clock)
  assert seen == [30, 60, 90]  # 4 s per chunk of 10 steps: due after 12 s, 24 s, 36 s


def test_a_finished_run_does_nothing_and_a_stalled_source_ends_the_loop():
  seen = []
  action = loop.PeriodicAction("log", lambda s: seen.append(s.step), every_steps=10)
  state, calls = _run(50, 50, max_steps_per_call=10, actions=[action])
  assert (state.step, calls, seen) == (50, [], [])
  state, calls = _run(0, 50, max_steps_per_call=10, actions=[action], stop_after=20)
  assert state.step == 20 and seen == [10, 20]


def test_parameter_server_closures_keep_workers_busy_within_steps_per_loop():
  from trainer.training import ps_source  # pylint: disable=g-import-not-at-top

  assert ps_source.closure_sizes(50, steps_per_loop=50, num_workers=2) == [25, 25]
  assert ps_source.closure_sizes(200, steps_per_loop=50, num_workers=2) == [50, 50, 50, 50]
  assert ps_source.closure_sizes(7, steps_per_loop=50, num_workers=2) == [4, 3]
  assert ps_source.closure_sizes(3, steps_per_loop=50, num_workers=8) == [1, 1, 1]


def test_an_agreement_fires_what_any_process_found_due():
  """Under MultiWorkerMirroredStrategy a clock or a signal decides on one process; the agreement makes every
  process fire it at the same step."""
  fired = []
  sigterm = [False]
  actions = [loop.PeriodicAction("log", lambda s: fired.append(("log", s.step)), every_steps=10),
             loop.PeriodicAction("preempt", lambda s: fired.append(("preempt", s.step)), when=lambda: sigterm[0],
                                 at_end=False)]
  peer_due = [False, True]  # what the other process found due: its SIGTERM arrived
  seen = []

  def agree(due):
    seen.append(list(due))
    return [a or b for a, b in zip(due, peer_due)]

  loop.fire_due(actions, loop.LoopState(step=5), agree=agree)
  assert fired == [("preempt", 5)] and seen == [[False, False]]
  sigterm[0] = True
  loop.fire_due(actions, loop.LoopState(step=10), agree=lambda due: due)
  assert fired == [("preempt", 5), ("log", 10), ("preempt", 10)]
