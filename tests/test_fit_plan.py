"""The pure arithmetic that makes `model.fit` stop exactly at --train_steps (no TensorFlow needed)."""

import pytest

from trainer import fit_loop


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
