"""The pure arithmetic that makes `model.fit` stop exactly at --train_steps (no TensorFlow needed)."""

import pytest

from trainer.training import fit_loop

# The quick tier (scripts/test.sh --quick): no test here trains for long or waits on peers.
pytestmark = pytest.mark.quick


@pytest.mark.parametrize("start,total,per_epoch,stop,calls", [
    (0, 31, 200, True, [(0, 1, 200)]),  # --epochs=1 of 31 steps: one epoch, cut short at step 31
    (0, 600, 200, True, [(0, 3, 200)]),
    (400, 600, 200, True, [(2, 3, 200)]),  # resumed from the checkpoint at 400
    (600, 600, 200, True, []),  # a finished run: nothing to train
    (0, 31, 200, False, [(0, 1, 31)]),  # parameter servers: no batch-level stop, so a shorter epoch
    (0, 650, 200, False, [(0, 3, 200), (3, 4, 50)]),
    (400, 650, 200, False, [(2, 3, 200), (3, 4, 50)]),
])
def test_fit_calls_end_exactly_at_the_final_step(start, total, per_epoch, stop, calls):
  assert fit_loop.fit_calls(start, total, per_epoch, stop_at_final_step=stop) == calls
  if not stop:
    assert start + sum((e - i) * s for i, e, s in calls) == total


def test_steps_per_execution_lands_on_every_checkpoint_and_the_end():
  assert fit_loop.fit_steps_per_execution(steps_per_loop=50, checkpoint_every_steps=200, train_steps=1000) == 50
  assert fit_loop.fit_steps_per_execution(steps_per_loop=50, checkpoint_every_steps=200, train_steps=31) == 1
  assert fit_loop.fit_steps_per_execution(steps_per_loop=10, checkpoint_every_steps=25, train_steps=60) == 5


def test_fit_reports_window_means_like_the_custom_loop():
  """Keras' logs are running means since the epoch began; the actions get the mean of the steps since the last
  report: losses 1.0 for steps 1-10 and 3.0 for steps 11-20 are reported as 1.0, then 3.0 (Keras says 2.0)."""
  window = fit_loop.WindowMeans()
  window.epoch_began(200)  # a resumed run: the epoch begins at step 200
  assert window(210, {"loss": 1.0, "accuracy": 0.5}) == {"loss": 1.0, "accuracy": 0.5}
  assert window(220, {"loss": 2.0, "accuracy": 0.75}) == {"loss": 3.0, "accuracy": 1.0}
  assert window(220, {"loss": 2.0}) == {"loss": 2.0}  # no new step: the running mean as it is
  window.epoch_began(400)
  assert window(405, {"loss": 0.5}) == {"loss": 0.5}

