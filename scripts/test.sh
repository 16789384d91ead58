#!/usr/bin/env bash
# Runs the test suite on a fresh machine: makes .venv, installs requirements-dev.txt, runs pytest; then the smoke
# subset (pytest -m smoke: train, export, serve, a multi-worker run) again on the prebuilt-image stack, TF 2.17 /
# Keras 3.4 in .venv-tf217 (requirements-tf217.txt), as Vertex's newest prebuilt TF training image runs it. The
# suite also serves its exports on TF 2.15 (.venv-tf215, requirements-tf215.txt), the prebuilt prediction image's.
# Tests start (and stop) every service they use themselves, the Cloud Storage emulator included.
#   bash scripts/test.sh            # all tests, then the TF 2.17 smoke subset
#   bash scripts/test.sh --quick    # the quick tier before each commit (pytest -m quick, two processes; < 3 min)
#   bash scripts/test.sh -k cluster # pytest arguments pass through (the smoke subset is then skipped)
#   SMOKE_TF217=0 bash scripts/test.sh   # skip the TF 2.17 subset
#   TEST_WORKERS=0 bash scripts/test.sh  # one test process instead of three
set -euo pipefail
cd "$(dirname "$0")/.."
smoke=0
if [ "${1:-}" = "--quick" ]; then
  shift
  set -- -m quick -n "${TEST_WORKERS:-2}" "$@"
fi
if [ "$#" -eq 0 ] && [ "${SMOKE_TF217:-1}" != "0" ]; then
  smoke=1
  # The prebuilt-image stack installs beside the main one (each install is mostly one core unpacking wheels);
  # both are done before any test starts, so no timed test shares the machine with pip.
  (VENV="$PWD/.venv-tf217" REQUIREMENTS=requirements-tf217.txt source scripts/bootstrap.sh) &
  smoke_install=$!
  # TF 2.15, what Vertex's newest prebuilt prediction image runs: tests/test_serving_tf215.py serves the exports
  # through its session loader, and a full run requires it.
  (VENV="$PWD/.venv-tf215" REQUIREMENTS=requirements-tf215.txt source scripts/bootstrap.sh) &
  serving_install=$!
  export REQUIRE_TF215=1
fi
source scripts/bootstrap.sh
if [ "$smoke" = "1" ]; then
  wait "$smoke_install"
  wait "$serving_install"
fi
# No test may reach a real Google host or a metadata server (the same table: scripts/loopback.py).
export GCE_METADATA_HOST=127.0.0.1:9 GCE_METADATA_IP=127.0.0.1:9 NO_GCE_CHECK=true TF_CPP_MIN_LOG_LEVEL=2
if [ "$#" -gt 0 ]; then
  exec "$VENV/bin/python" -m pytest "$@"
fi
# Three test processes (pytest-xdist) on CI's two cores: with two, the cores sat 9-16% idle in the multi-process
# files while tests waited on peers, emulators, timeouts and pip; a third takes up that slack (docs/contributing.md
# has the figures). worksteal keeps them busy while the long multi-process tests run. TEST_WORKERS=N sets the
# count; TEST_WORKERS=0 runs everything in this one process.
workers="${TEST_WORKERS:-3}"
if [ "$workers" = "0" ]; then
  "$VENV/bin/python" -m pytest --durations=15
else
  "$VENV/bin/python" -m pytest -n "$workers" --dist worksteal --durations=15
fi
if [ "$smoke" = "1" ]; then
  echo "--- the smoke subset on $("$PWD/.venv-tf217/bin/python" -c 'import tensorflow as tf, keras; print(f"TF {tf.__version__}, Keras {keras.__version__}")' 2>/dev/null)"
  # Only the files that hold smoke tests are collected: the others import tools the image stack does not carry.
  "$PWD/.venv-tf217/bin/python" -m pytest -m smoke $(grep -l "pytest.mark.smoke" tests/test_*.py)
fi
