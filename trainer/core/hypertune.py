"""Reports the final metric to Vertex AI hyperparameter tuning.

Vertex reads JSON lines from the file named by CLOUD_ML_HP_METRIC_FILE (default /tmp/hypertune/output.metrics),
in the format the `cloudml-hypertune` package writes; this module writes the same lines so the trainer needs no
extra dependency.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any, Callable, Mapping

from absl import logging

from trainer.core.errors import UserError

DEFAULT_PATH = "/tmp/hypertune/output.metrics"


def report(metrics: Mapping[str, Any], *, metric: str, trial: str | None, step: int, path: str,
           clock: Callable[[], float] = time.time) -> dict[str, str | float]:
  """Appends one metric line for `metric` (looked up as `eval_<metric>` in `metrics`) and returns it."""
  key = f"eval_{metric}"
  if key not in metrics:
    available = sorted(k[len("eval_"):] for k in metrics if k.startswith("eval_"))
    raise UserError(f"--hypertune_metric={metric!r} was not computed; available: {', '.join(available) or 'none'} "
                    "(is --eval_data set?)")
  line = {"timestamp": clock(), "trial": str(trial or 0), metric: str(metrics[key]), "global_step": str(step),
          "checkpoint_path": ""}
  os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
  with open(path, "a") as f:
    f.write(json.dumps(line) + "\n")
  logging.info("Reported %s=%s to hyperparameter tuning (%s)", metric, metrics[key], path)
  return line
