#!/usr/bin/env bash
# The main job end to end on this machine, against emulated Cloud Storage (no cloud account):
#   start the emulator -> stage the demo data to gs:// -> train from gs:// -> export to gs://
#   -> load the exported model from gs:// and predict the eval split.
# Fails unless the served model reaches the accuracy threshold below.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/bootstrap.sh
export TF_CPP_MIN_LOG_LEVEL=2 PYTHONPATH="$PWD"
EMULATOR_DIR="$(mktemp -d)"
"$VENV/bin/python" - "$EMULATOR_DIR" <<'PY' > "$EMULATOR_DIR/env.sh"
import sys
from scripts import gcs_emulator
emulator = gcs_emulator.start(buckets=("demo-bucket",), directory=sys.argv[1])
print(emulator.exports() + f"EMULATOR_PIDS='{' '.join(map(str, emulator.pids))}'")
PY
source "$EMULATOR_DIR/env.sh"
trap 'kill $EMULATOR_PIDS 2>/dev/null || true; rm -rf "$EMULATOR_DIR"' EXIT

BUCKET=gs://demo-bucket
"$VENV/bin/python" scripts/stage_data.py --demo --destination=$BUCKET/data
"$VENV/bin/python" -m trainer.task --train_data="$BUCKET/data/train/*.tfrecord" \
  --eval_data="$BUCKET/data/eval/*.tfrecord" --output_dir=$BUCKET/run --train_steps=1000 --global_batch_size=256
"$VENV/bin/python" scripts/check_model.py --model_dir=$BUCKET/run/model --eval_data="$BUCKET/data/eval/*.tfrecord" \
  --min_accuracy=0.88
