#!/usr/bin/env bash
# The main job: plan GPT-3 175B for 1,024 A100s and print the plan, then plan a tiny GPT for 4 local CPU
# processes and train it with that plan, verified against single-process training.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export PATH="$PWD/.venv/bin:$PATH"
partita plan --model gpt3-175b --cluster 128x8xA100-80GB --global-batch 1536 --seq 2048
echo
out=$(mktemp -d)
partita plan --model tiny-gpt --cluster 4xcpu --global-batch 8 --out "$out/tiny-plan.json"
echo
partita run "$out/tiny-plan.json" --model tiny-gpt --steps 3 --verify
