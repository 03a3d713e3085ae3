# Sourced by main.sh and test.sh: a virtual environment (.venv, or $WAVEFRONT_VENV) with the
# package, the 13.4 compiler stack (cuda-tile[tileiras]) and pytest; sets $VENV.
PY="${PYTHON:-python3}"
VENV="${WAVEFRONT_VENV:-.venv}"
if [ ! -x "$VENV/bin/python" ]; then
    "$PY" -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install -q --upgrade pip
"$VENV/bin/python" -m pip install -q -e ".[gpu,test,distributed]"
# torch for the CPU tests of wavefront.torch (schemas, fake implementations, refusals), only
# where a CPU build of it lies in a local wheel folder: a CUDA build from the index would be
# gigabytes. Without it those tests skip; the GPU tests run on the GPU host's own torch.
for dir in ${PIP_FIND_LINKS:-}; do
    for wheel in "$dir"/torch-*+cpu-cp3*.whl; do
        [ -f "$wheel" ] || continue
        "$VENV/bin/python" -c "import torch" 2>/dev/null \
            || "$VENV/bin/python" -m pip install -q "$wheel" || true
    done
done
# An older toolkit named here would be picked up by tileiras and fail ("Return code 5").
unset CUDA_HOME CUDA_PATH
