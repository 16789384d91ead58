#!/usr/bin/env bash
# Runs the test suite on a fresh machine: makes .venv, installs requirements-dev.txt, runs pytest.
# Tests start (and stop) every service they use themselves, the Cloud Storage emulator included.
#   bash scripts/test.sh            # all tests
#   bash scripts/test.sh -k cluster # pytest arguments pass through
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/bootstrap.sh
# No test may reach a real Google host or a metadata server (the same table: scripts/loopback.py).
export GCE_METADATA_HOST=127.0.0.1:9 GCE_METADATA_IP=127.0.0.1:9 NO_GCE_CHECK=true TF_CPP_MIN_LOG_LEVEL=2
exec "$VENV/bin/python" -m pytest "$@"
