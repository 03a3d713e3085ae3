#!/usr/bin/env bash
# Set up (a virtual environment with the package, the 13.4 compiler stack and pytest) and run
# the test suite. GPU tests run where a GPU is visible and skip cleanly elsewhere; CPU tests
# still compile every kernel specialisation ahead of time for sm_90.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
VENV="${WAVEFRONT_VENV:-.venv}"
if [ ! -x "$VENV/bin/python" ]; then
    "$PY" -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install -q --upgrade pip
"$VENV/bin/python" -m pip install -q -e ".[gpu,test]"
# An older toolkit named here would be picked up by tileiras and fail ("Return code 5").
unset CUDA_HOME CUDA_PATH
exec "$VENV/bin/python" -m pytest -q -p no:cacheprovider "$@"
