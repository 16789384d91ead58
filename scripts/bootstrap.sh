# Sourced by the other scripts: creates .venv (once) and installs the pinned requirements into it.
# Re-installs only when requirements-dev.txt changes (its hash is kept in .venv).
VENV="${VENV:-$PWD/.venv}"
if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
fi
want="$(sha256sum requirements-dev.txt | cut -d' ' -f1)"
if [ "$(cat "$VENV/.requirements.sha256" 2>/dev/null)" != "$want" ]; then
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check -r requirements-dev.txt
  echo "$want" > "$VENV/.requirements.sha256"
fi
