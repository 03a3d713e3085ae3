# Sourced by main.sh and test.sh: a virtual environment (.venv, or $WAVEFRONT_VENV) with the
# package, the 13.4 compiler stack (cuda-tile[tileiras]) and pytest; sets $VENV.
PY="${PYTHON:-python3}"
VENV="${WAVEFRONT_VENV:-.venv}"
if [ ! -x "$VENV/bin/python" ]; then
    "$PY" -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install -q --upgrade pip
"$VENV/bin/python" -m pip install -q -e ".[gpu,test,distributed]"
# An older toolkit named here would be picked up by tileiras and fail ("Return code 5").
unset CUDA_HOME CUDA_PATH
