#!/usr/bin/env bash
# Set up (a virtual environment with the package, its gpu and test extras) and run the checks:
# the import-layer contract, then the test suite. GPU tests run where a GPU is visible and skip
# cleanly elsewhere (they fail where a GPU is present but the CUDA stack is broken); CPU tests
# still compile every kernel specialisation ahead of time. `-m "not slow"` skips the minutes-long
# ones (full compilation, the paper build) while developing; CI runs everything.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/venv.sh
"$VENV/bin/lint-imports"
exec "$VENV/bin/python" -m pytest -q -p no:cacheprovider "$@"
