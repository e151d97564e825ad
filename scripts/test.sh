#!/usr/bin/env bash
# Set up and run the whole test suite (pass extra pytest arguments, e.g. -m "not slow" for a quick run).
# Two pytest-xdist workers by default (PARTITA_TEST_WORKERS=N for another count, 0 for one process): most tests
# wait on launched ranks and rendezvous as much as they compute, so two of them share 2 cores well.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
exec .venv/bin/python -m pytest -q -n "${PARTITA_TEST_WORKERS:-2}" "$@"
