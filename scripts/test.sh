#!/usr/bin/env bash
# Set up (a virtual environment with the package, the 13.4 compiler stack and pytest) and run
# the test suite. GPU tests run where a GPU is visible and skip cleanly elsewhere; CPU tests
# still compile every kernel specialisation ahead of time for sm_90.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/venv.sh
exec "$VENV/bin/python" -m pytest -q -p no:cacheprovider "$@"
