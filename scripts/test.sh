#!/usr/bin/env bash
# Set up and run the whole test suite (pass extra pytest arguments, e.g. -m "not slow" for a quick run).
# Three pytest-xdist workers by default (PARTITA_TEST_WORKERS=N for another count, 0 for one process): most tests
# wait on launched ranks and rendezvous as much as they compute, so three of them keep 2 cores busy. On the 2-core
# machine (2026-11-30, fresh clones of effaca7 and 583ebca): 2 workers kept 1.5 cores busy and took 28:12 (about 23
# minutes without a test that hung for 5 of them), 3 workers 19:31. Four workers are slower: a fresh clone of 8e6a187
# took 25:40 of tests with 4 against 21-22 with 3 (user + sys 46 CPU-minutes against 39: the suite is CPU-bound, and
# more ranks at once only add contention). Work stealing (--dist worksteal): with pytest-xdist's default "load"
# scheduling, the first worker's first chunk (a quarter of its share, about 207 tests) was tests/conftest.py's
# LONGEST_FIRST tests and it never went back for more: in session 70 (2026-12-01) it ran 19:00 of tests while the other
# two idled after 12:40. Stealing hands an idle worker half of the busiest one's queue, from its end.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
exec .venv/bin/python -m pytest -q -n "${PARTITA_TEST_WORKERS:-3}" --dist worksteal "$@"
