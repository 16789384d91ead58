"""The training loops in-process on small data, in seconds: the default, one-device and mirrored (2 logical
CPUs) strategies give the same weights, the loop's cadence and resume, exact --epochs and eval counts under
both loops. Multi-process strategies stay in test_multiworker.py."""

import glob
import json

import numpy as np
import pytest
import tensorflow as tf
from absl import flags

from trainer import flags as trainer_flags
from trainer.core import config as config_lib
from trainer.distribute import plan as plan_lib
from trainer.distribute import strategy as strategy_lib
from trainer.modeling import models
from trainer.planning import job as job_lib
from trainer.planning import preflight
from trainer.training import dispatch as training


def make_job(churn_data, out, *args, strategy="default"):
  """A Job as the runner builds one (`job.build_job`), for a single process and the named strategy."""
  values = flags.FlagValues()
  trainer_flags.define_flags(values)
  values(["trainer", f"--train_data={churn_data}/train/*.tfrecord", f"--eval_data={churn_data}/eval/*.tfrecord",
          f"--output_dir={out}", "--global_batch_size=128", f"--strategy={strategy}",
          f"--num_cpu_devices={2 if strategy == 'mirrored' else 1}", *args])
  env = config_lib.Environment()
  config = trainer_flags.config_from_flags(values, env)
  plan = plan_lib.make_plan(config, env, num_gpus=0, keras_version=models.keras_version())
  tf.keras.utils.set_random_seed(config.train.seed)
  # The logical CPUs were split once for the whole test process (conftest): the strategy sees both.
  strategy_object = strategy_lib.build_strategy(plan.choice, plan.role, strategy_lib.Devices(num_cpu_devices=2))
  return job_lib.build_job(config, plan, preflight.check_inputs(config), strategy_object, env=env)


def train_steps_logged(out, split="train"):
  """Steps with a `loss` scalar, over every event file (a resumed run writes its own)."""
  return sorted(e.step for events in glob.glob(str(out / "logs" / split / "events.out.tfevents.*"))
                for e in tf.compat.v1.train.summary_iterator(events) if any(v.tag == "loss" for v in e.summary.value))


def checkpoint_steps(out):
  return sorted(int(p.rsplit("-", 1)[1].split(".")[0]) for p in glob.glob(str(out / "checkpoints" / "ckpt-*.index")))


def weights(model):
  return [w.numpy() for w in model.weights]


def test_custom_loop_cadence_and_resume(churn_data, tmp_path):
  out = tmp_path / "out"
  first = training.train(make_job(churn_data, out, "--train_steps=30", "--log_every_steps=10",
                                        "--checkpoint_every_steps=15", "--steps_per_loop=8"))
  assert first.final_step == 30 and first.resumed_from_step == 0
  assert train_steps_logged(out) == [10, 20, 30]
  assert checkpoint_steps(out) == [15, 30]
  assert first.train_loss < 0.6  # from about 0.69 (two balanced classes) at step 0
  assert first.eval_metrics["examples"] == 1000  # 7 full batches of 128 and one of 104
  again = training.train(make_job(churn_data, out, "--train_steps=45", "--log_every_steps=10",
                                        "--checkpoint_every_steps=15", "--steps_per_loop=8"))
  assert again.resumed_from_step == 30 and again.final_step == 45
  assert train_steps_logged(out) == [10, 20, 30, 40, 45] and checkpoint_steps(out) == [15, 30, 45]


def test_default_one_device_and_mirrored_train_the_same_weights(churn_data, tmp_path):
  """One global batch of 128 in one replica or split over two gives the same gradient (the loss is averaged
  over the global batch): the in-process proof that strategy.run, reduction and input sharding agree."""
  results = {}
  for strategy in ("default", "one_device", "mirrored"):
    job = make_job(churn_data, tmp_path / strategy, "--train_steps=20", "--shuffle_buffer=0",
                   "--deterministic_input", strategy=strategy)
    result = training.train(job)
    results[strategy] = (job.strategy.num_replicas_in_sync, weights(result.model), result.eval_metrics)
  assert [results[s][0] for s in ("default", "one_device", "mirrored")] == [1, 1, 2]
  for strategy in ("one_device", "mirrored"):
    for expected, got in zip(results["default"][1], results[strategy][1]):
      np.testing.assert_allclose(got, expected, rtol=2e-4, atol=2e-5, err_msg=strategy)
    assert results[strategy][2]["examples"] == 1000
    assert results[strategy][2]["loss"] == pytest.approx(results["default"][2]["loss"], rel=1e-4)


@pytest.mark.parametrize("loop", ["custom", "fit"])
def test_epochs_and_log_cadence_under_both_loops(churn_data, tmp_path, loop):
  out = tmp_path / "out"
  # 4000 examples / 128 = 31 steps; fit used to train 31 // 200 (the checkpoint period) = 0 Keras epochs.
  job = make_job(churn_data, out, "--epochs=1", "--log_every_steps=10", f"--loop={loop}", "--steps_per_loop=50")
  assert job.train_steps == 31
  result = training.train(job)
  assert result.final_step == 31
  assert train_steps_logged(out) == [10, 20, 30, 31]  # --log_every_steps holds under fit too
  assert checkpoint_steps(out) == [31]
  assert result.eval_metrics["examples"] == 1000


def test_eval_steps_caps_the_pass_under_mirrored(churn_data, tmp_path):
  job = make_job(churn_data, tmp_path / "out", "--train_steps=2", "--eval_steps=3", strategy="mirrored")
  assert training.train(job).eval_metrics["examples"] == 3 * 128


def _overflowing_data(churn_data, tmp_path):
  """A regression task on the churn data (predict monthly_charges) whose label is 3e38 in every 10th example: finite,
  so the input pipeline takes it (a NaN there is refused where it is read: tests/test_non_finite.py), but its
  square overflows float32, so the loss becomes inf."""
  directory = tmp_path / "overflow"
  for split in ("train", "eval"):
    (directory / split).mkdir(parents=True)
    schema = json.load(open(f"{churn_data}/{split}/schema.json"))
    schema["features"] = [f for f in schema["features"] if f["name"] != "monthly_charges"]
    schema["label"] = {"name": "monthly_charges", "type": "float"}
    (directory / split / "schema.json").write_text(json.dumps(schema))
    with tf.io.TFRecordWriter(str(directory / split / "part-0.tfrecord")) as writer:
      for i, record in enumerate(tf.data.TFRecordDataset(sorted(glob.glob(f"{churn_data}/{split}/*.tfrecord")))):
        example = tf.train.Example.FromString(record.numpy())
        if split == "train" and i % 10 == 0:
          example.features.feature["monthly_charges"].float_list.value[0] = 3e38
        writer.write(example.SerializeToString())
  return str(directory)


@pytest.mark.parametrize("loop", ["custom", "fit"])
def test_a_non_finite_loss_stops_before_anything_is_saved(churn_data, tmp_path, loop):
  from trainer.core.errors import UserError  # pylint: disable=g-import-not-at-top

  out = tmp_path / "out"
  job = make_job(_overflowing_data(churn_data, tmp_path), out, "--train_steps=40", "--checkpoint_every_steps=10",
                 "--steps_per_loop=5", f"--loop={loop}")
  with pytest.raises(UserError, match=r"^the training loss became (nan|inf) within steps 1-5; nothing from those steps "
                                      r"is checkpointed or exported; look for NaN or inf in the data"):
    training.train(job)
  assert checkpoint_steps(out) == []


def test_checkpoints_by_time_as_well_as_steps(churn_data, tmp_path):
  out = tmp_path / "out"
  training.train(make_job(churn_data, out, "--train_steps=30", "--steps_per_loop=5",
                                "--checkpoint_every_steps=1000", "--checkpoint_every_secs=0.000001"))
  assert checkpoint_steps(out) == [20, 25, 30]  # one after every chunk (3 kept), not only at the end


BUGGY_PLUGIN = '''
import tensorflow as tf


class PicksAColumnThatIsNotThere(tf.keras.layers.Layer):
  """A bug that shows only in training (the plug-in check runs the model with training=False)."""

  def call(self, x, training=None):
    return tf.gather(x, [100, 0, 1], axis=1) if training else x


def build(schema, hparams):
  numeric = [f for f in schema.features if f.type != "string"]
  inputs = tf.keras.Input((len(numeric),))
  x = PicksAColumnThatIsNotThere()(inputs)
  return tf.keras.Model(inputs, tf.keras.layers.Dense(schema.label.num_classes)(tf.keras.layers.Dense(4)(x)))
'''


@pytest.mark.parametrize("loop", ["custom", "fit"])
def test_a_bug_in_the_model_is_not_called_bad_data(churn_data, tmp_path, monkeypatch, loop):
  """Only errors out of the input pipeline are the data's: the model's own InvalidArgumentError reaches the user
  unchanged, with its traceback, and no file is read again to look for a bad record."""
  (tmp_path / "buggy_models.py").write_text(BUGGY_PLUGIN)
  monkeypatch.syspath_prepend(str(tmp_path))
  from trainer.planning import preflight as preflight_lib  # pylint: disable=g-import-not-at-top

  looked_up = []
  monkeypatch.setattr(preflight_lib, "find_bad_record", lambda *a, **k: looked_up.append(a))
  job = make_job(churn_data, tmp_path / "out", "--train_steps=10", "--model=buggy_models:build", f"--loop={loop}")
  with pytest.raises(tf.errors.InvalidArgumentError, match=r"indices\[\d+(,\d+)*\] = 100 is not in \[0, 3\)"):
    training.train(job)
  assert not looked_up


def test_an_error_out_of_the_input_pipeline_is_named_and_keeps_its_cause(churn_data, tmp_path):
  """A record that does not fit, met deep in training: one line naming file, record and column, TF's error as
  its cause."""
  from trainer.core.errors import UserError  # pylint: disable=g-import-not-at-top

  data = tmp_path / "data"
  (data / "train").mkdir(parents=True)
  schema = json.load(open(f"{churn_data}/train/schema.json"))
  (data / "train" / "schema.json").write_text(json.dumps(schema))
  records = [r.numpy() for r in tf.data.TFRecordDataset(sorted(glob.glob(f"{churn_data}/train/*.tfrecord")))]
  with tf.io.TFRecordWriter(str(data / "train" / "part-0.tfrecord")) as writer:
    for i, record in enumerate(records[:600]):
      example = tf.train.Example.FromString(record)
      if i == 500:  # past pre-flight's sample (--preflight_records=100): found only when training reads it
        del example.features.feature["support_calls"]
      writer.write(example.SerializeToString())
  job = make_job(str(data), tmp_path / "out", "--train_steps=20", "--shuffle_buffer=0", "--eval_steps=0",
                 f"--train_data={data}/train/*.tfrecord", "--preflight_records=100")
  with pytest.raises(UserError, match=r"^--train_data: .*part-0.tfrecord record 501: feature 'support_calls' is "
                                      r"missing") as raised:
    training.train(job)
  assert isinstance(raised.value.__cause__, tf.errors.InvalidArgumentError)
  assert "IteratorGetNext" in str(raised.value.__cause__)
