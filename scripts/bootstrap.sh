# Sourced by the other scripts: creates $VENV (default .venv, once) and installs the pinned $REQUIREMENTS
# (default requirements-dev.txt) into it. Re-installs only when that file changes (its hash is kept in the venv).
VENV="${VENV:-$PWD/.venv}"
REQUIREMENTS="${REQUIREMENTS:-requirements-dev.txt}"
if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
fi
want="$(sha256sum "$REQUIREMENTS" | cut -d' ' -f1)"
if [ "$(cat "$VENV/.requirements.sha256" 2>/dev/null)" != "$want" ]; then
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check -r "$REQUIREMENTS"
  echo "$want" > "$VENV/.requirements.sha256"
fi
