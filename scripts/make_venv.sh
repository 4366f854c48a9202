#!/usr/bin/env bash
# Make sure VENV (default .venv) holds requirements.txt and this project, built with PYTHON
# (default python3).
# Rebuilt when it is missing, when requirements.txt's content changed since it was built, or when
# PYTHON_EXPLICIT=1 and PYTHON is another interpreter than the one it was built with.
# torch is installed first, from its pinned line: resolving a bare or ranged `torch` on a machine
# without torch pulls a multi-GB CUDA build.
# The project is then installed editable and without dependencies (requirements.txt brought them),
# so its packages import from any folder; a change of pyproject.toml alone reinstalls just the
# project. pip builds it in an isolated environment with the setuptools pyproject.toml asks for.
set -euo pipefail
PYTHON=${PYTHON:-python3}
VENV=${VENV:-.venv}
digest() {
  "$PYTHON" -c "import hashlib, sys; print(hashlib.sha256(open(sys.argv[1], 'rb').read()).hexdigest()[:16])" "$1"
}
want_hash=$(digest requirements.txt)
want_project=$(digest pyproject.toml)
want_python=$("$PYTHON" -c "import sys; print(sys.executable, sys.version.split()[0])")
have_hash=$(cat "$VENV/.requirements-sha" 2>/dev/null || true)
have_project=$(cat "$VENV/.project-sha" 2>/dev/null || true)
have_python=$(cat "$VENV/.built-with" 2>/dev/null || true)
if [ -x "$VENV/bin/python" ] && [ "$have_hash" = "$want_hash" ] \
    && { [ "${PYTHON_EXPLICIT:-0}" != 1 ] || [ "$have_python" = "$want_python" ]; }; then
  if [ "$have_project" = "$want_project" ]; then
    exit 0
  fi
  echo "installing the project into $VENV (pyproject.toml $want_project)"
else
  echo "building $VENV with $want_python (requirements.txt $want_hash)"
  rm -rf "$VENV"
  "$PYTHON" -m venv "$VENV"
  "$VENV/bin/python" -m pip install --quiet "$(grep -E '^torch==' requirements.txt)"
  "$VENV/bin/python" -m pip install --quiet -r requirements.txt
  echo "$want_python" > "$VENV/.built-with"
  echo "$want_hash" > "$VENV/.requirements-sha"
fi
rm -f "$VENV/.project-sha"
"$VENV/bin/python" -m pip install --quiet --no-deps -e .
echo "$want_project" > "$VENV/.project-sha"
