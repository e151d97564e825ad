#!/usr/bin/env bash
# Plan tiny-gpt for 2 local CPU processes, then train with the plan under torchrun (gloo) and verify every
# loss against single-process training on the same batches. Needs scripts/setup.sh to have run once.
#
#   bash examples/run_tiny.sh [STEPS]
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS=${1:-5}
PARTITA=${PARTITA:-.venv/bin/partita}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

"$PARTITA" plan --model tiny-gpt --cluster 2xcpu --global-batch 8 --out "$work/plan.json"
echo
# partita run launches: python -m torch.distributed.run --standalone --nproc-per-node 2 -m partita.runtime.train ...
OMP_NUM_THREADS=1 "$PARTITA" run "$work/plan.json" --model tiny-gpt --steps "$STEPS" --verify
