#!/usr/bin/env bash
# Create .venv (if missing) and install partita with its test and rec extras (TorchRec, for recommendation models). Development and CI install the exact
# versions of constraints.txt (torch 2.13.0, the CPU build: a local wheel on our machines), so every machine
# resolves the same set; pyproject.toml itself keeps ranges for users.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
stamp=.venv/.partita-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ] || [ scripts/setup.sh -nt "$stamp" ] || [ constraints.txt -nt "$stamp" ]; then
  .venv/bin/python -m pip install --quiet --upgrade pip >/dev/null 2>&1 || true
  .venv/bin/python -m pip install --quiet -c constraints.txt "torch==2.13.0"
  .venv/bin/python -m pip install --quiet -c constraints.txt -e ".[test]"
  # torchrec declares the CUDA fbgemm-gpu, which breaks its import on CPU: beside fbgemm-gpu-cpu (the rec extra)
  .venv/bin/python -m pip install --quiet -c constraints.txt --no-deps torchrec
  touch "$stamp"
fi
