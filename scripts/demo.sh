#!/usr/bin/env bash
# The main job end to end on this machine, as Vertex AI would run it, against emulated Cloud Storage
# (no cloud account):
#   start the emulator -> stage the demo data to gs:// -> run cloud_configs/multi_worker_gpu.yaml locally
#   (chief + 1 worker, each with 2 "GPUs") from the staged sdist -> export to gs://
#   -> load the exported model from gs:// and predict the eval split.
# Fails unless the served model reaches the accuracy threshold below.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/bootstrap.sh
export TF_CPP_MIN_LOG_LEVEL=2 PYTHONPATH="$PWD"
EMULATOR_DIR="$(mktemp -d)"
"$VENV/bin/python" - "$EMULATOR_DIR" <<'PY' > "$EMULATOR_DIR/env.sh"
import sys
from scripts import emulator as emulator_lib
emulator = emulator_lib.start(buckets=("demo-bucket",), directory=sys.argv[1])
print(emulator.exports() + f"EMULATOR_PIDS='{' '.join(map(str, emulator.pids))}'")
PY
source "$EMULATOR_DIR/env.sh"
trap 'kill $EMULATOR_PIDS 2>/dev/null || true; rm -rf "$EMULATOR_DIR"' EXIT

"$VENV/bin/python" -m scripts.stage_data --demo --destination=gs://demo-bucket/data
"$VENV/bin/python" -m scripts.local_vertex --config=cloud_configs/multi_worker_gpu.yaml --bucket=demo-bucket \
  --run_id=demo --replica_count=1=1 --args=--train_steps=600 --args=--global_batch_size=256
"$VENV/bin/python" -m scripts.check_model --model_dir=gs://demo-bucket/runs/demo/model \
  --eval_data="gs://demo-bucket/data/eval/*.tfrecord" --min_accuracy=0.88
