#!/usr/bin/env bash
# The main job end to end on this machine: demo data -> train -> SavedModel -> predictions.
# Fails unless the exported model reaches the accuracy threshold below on the eval split.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/bootstrap.sh
export GCE_METADATA_HOST=127.0.0.1:9 GCE_METADATA_IP=127.0.0.1:9 NO_GCE_CHECK=true TF_CPP_MIN_LOG_LEVEL=2
OUT="${DEMO_OUTPUT:-$PWD/demo_output}"
rm -rf "$OUT"
"$VENV/bin/python" scripts/demo_data.py --output_dir="$OUT/data"
"$VENV/bin/python" -m trainer.task --train_data="$OUT/data/train/*.tfrecord" --eval_data="$OUT/data/eval/*.tfrecord" \
  --output_dir="$OUT/run" --train_steps=1000 --global_batch_size=256
"$VENV/bin/python" scripts/check_model.py --model_dir="$OUT/run/model" --eval_data="$OUT/data/eval/*.tfrecord" \
  --min_accuracy=0.88
