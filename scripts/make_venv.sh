#!/usr/bin/env bash
# Make sure VENV (default .venv) holds requirements.txt, built with PYTHON (default python3).
# Rebuilt when it is missing, when requirements.txt's content changed since it was built, or when
# PYTHON_EXPLICIT=1 and PYTHON is another interpreter than the one it was built with.
# torch is installed first, from its pinned line: resolving a bare or ranged `torch` on a machine
# without torch pulls a multi-GB CUDA build.
set -euo pipefail
PYTHON=${PYTHON:-python3}
VENV=${VENV:-.venv}
want_hash=$("$PYTHON" -c "import hashlib; print(hashlib.sha256(open('requirements.txt', 'rb').read()).hexdigest()[:16])")
want_python=$("$PYTHON" -c "import sys; print(sys.executable, sys.version.split()[0])")
have_hash=$(cat "$VENV/.requirements-sha" 2>/dev/null || true)
have_python=$(cat "$VENV/.built-with" 2>/dev/null || true)
if [ -x "$VENV/bin/python" ] && [ "$have_hash" = "$want_hash" ] \
    && { [ "${PYTHON_EXPLICIT:-0}" != 1 ] || [ "$have_python" = "$want_python" ]; }; then
  exit 0
fi
echo "building $VENV with $want_python (requirements.txt $want_hash)"
rm -rf "$VENV"
"$PYTHON" -m venv "$VENV"
"$VENV/bin/python" -m pip install --quiet "$(grep -E '^torch==' requirements.txt)"
"$VENV/bin/python" -m pip install --quiet -r requirements.txt
echo "$want_python" > "$VENV/.built-with"
echo "$want_hash" > "$VENV/.requirements-sha"
