#!/usr/bin/env bash
# Set up and run the whole test suite (pass extra pytest arguments, e.g. -m "not slow" for a quick run).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
exec .venv/bin/python -m pytest -q "$@"
