"""The training job of one process, as typed values: `Job` (what a loop needs) and `TrainResult` (what it gives).

`build_job(config, plan, inputs, strategy)` is the one place a `Job` is assembled, for the runner and the tests
alike (official's `run_experiment` is the same kind of seam). No TensorFlow at import time.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

from trainer.core import config as config_lib
from trainer.core import hypertune
from trainer.data import formats
from trainer.data import input_pipeline
from trainer.data import schema as schema_lib
from trainer.distribute import cluster as cluster_lib
from trainer.distribute import plan as plan_lib
from trainer.distribute import strategy as strategy_lib
from trainer.modeling import backbones
from trainer.modeling import model_registry
from trainer.modeling import recipe
from trainer.planning import preflight


@dataclasses.dataclass(frozen=True)
class Job:
  """Everything a training run needs, resolved and validated before it starts."""

  config: config_lib.Config
  inputs: preflight.Inputs  # the schema, each split's files and how to read them, as pre-flight found them
  strategy: Any
  choice: strategy_lib.StrategyChoice
  role: cluster_lib.ClusterRole
  train_steps: int
  interactive: bool
  build_model: Callable[..., Any]
  peer_watchdog: Any = None  # peers.PeerWatchdog in a multi-process job: fed after every chunk
  report_eval: Callable[[dict, int], None] | None = None  # each periodic evaluation to hyperparameter tuning
  # A backbone model's second phase (the backbone opens, the learning rate drops), resolved once from the run's
  # length: the model builder and the learning-rate schedule read this one value.
  fine_tune: recipe.FineTune | None = None

  @property
  def schema(self) -> schema_lib.Schema:
    return self.inputs.schema

  @property
  def train_files(self) -> list[str]:
    return self.inputs.train_files

  @property
  def eval_files(self) -> list[str]:
    return self.inputs.eval_files

  @property
  def sources(self) -> dict[str, formats.Source]:
    """"train"/"eval" -> format, compression, CSV columns."""
    return self.inputs.sources

  @property
  def class_weights(self) -> tuple[float, ...] | None:
    """By class id (--class_weights), resolved by pre-flight."""
    return self.inputs.class_weights

  def reading_data(self, split: str = "train"):
    """Context for the code that pulls batches of `split`: an error out of the input pipeline becomes one line
    naming the split's flag, the file, record and column (`data_errors`); any other error passes unchanged."""
    from trainer.planning import data_errors  # pylint: disable=g-import-not-at-top

    return data_errors.translated(self.inputs, splits=(split,))

  def peers_moved(self, next_wait: str) -> None:
    """The job moved past a wait on peers; `next_wait` names the next one (for the watchdog's message)."""
    if self.peer_watchdog is not None:
      self.peer_watchdog.feed(next_wait)

  @property
  def is_chief(self) -> bool:
    return self.role.is_chief

  @property
  def test_files(self) -> list[str]:
    return self.inputs.test_files

  def dataset_fn(self, split: str, *, select: list[str] | None = None) -> Callable:
    """`dataset_fn(input_context)` for `split` ("train", "eval", "test"): training data repeats; eval data is one
    pass (or --eval_steps batches) with the last batch partial, test data exactly one pass. `select` keeps only the
    model's inputs (Keras `fit` wants that)."""
    cfg = self.config
    training = split == "train"
    files = self.inputs.files(split)
    return input_pipeline.make_dataset_fn(
        files, self.schema, source=self.sources[split], global_batch_size=cfg.train.global_batch_size,
        training=training, shuffle_buffer=cfg.data.shuffle_buffer,
        # Under parameter servers every worker reads all files: distinct seeds keep their orders apart (the plan
        # refuses --deterministic_input there, since asynchronous updates are not reproducible anyway).
        seed=None if self.choice.parameter_server else cfg.train.seed,
        select=select, deterministic=cfg.data.deterministic,
        max_batches=cfg.train.eval_steps if split == "eval" else None,
        file_cache_bytes=cfg.data.uri_cache_mb << 20)


@dataclasses.dataclass
class TrainResult:
  final_step: int
  resumed_from_step: int
  train_loss: float | None
  examples_per_sec: float | None
  eval_metrics: dict[str, float]
  model: Any = None
  test_metrics: dict[str, float] = dataclasses.field(default_factory=dict)  # --test_data, once after training


def build_job(config: config_lib.Config, plan: plan_lib.Plan, inputs: preflight.Inputs, strategy: Any, *,
              env: config_lib.Environment | None = None, interactive: bool = False, peer_watchdog: Any = None) -> Job:
  """The `Job` for this process: its data, the model builder for the schema, and where each periodic evaluation
  is reported (the chief's, to hyperparameter tuning with --hypertune_metric and --eval_every_steps)."""
  build = model_registry.resolve_builder(config.model.name)
  train_steps = preflight.total_steps(config, inputs)
  fine_tune = backbones.fine_tune(config.model, train_steps)
  model_config = backbones.resolved(config.model, fine_tune)
  return Job(config=config, inputs=inputs, strategy=strategy, choice=plan.choice, role=plan.role,
             train_steps=train_steps, interactive=interactive,
             build_model=lambda: build(inputs.schema, model_config, config.hparams), peer_watchdog=peer_watchdog,
             report_eval=_hypertune_reporter(config, env or config_lib.Environment(), plan.role), fine_tune=fine_tune)


def _hypertune_reporter(config: config_lib.Config, env: config_lib.Environment, role: cluster_lib.ClusterRole):
  """With --eval_every_steps, each evaluation goes to hyperparameter tuning at its step (the chief's)."""
  metric = config.train.hypertune_metric
  if not metric or not config.train.eval_every_steps or not role.is_chief:
    return None
  path = env.hp_metric_file or hypertune.DEFAULT_PATH
  return lambda metrics, step: hypertune.report(metrics, metric=metric, trial=role.trial, step=step, path=path)
