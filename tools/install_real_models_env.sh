#!/usr/bin/env bash
# The environment of the real classifiers' tests: torchvision/timm need a
# torch with a matching torchvision wheel, which the main stack's CPU torch
# 2.13 has none of here (SPEC: torch 2.14.1 + torchvision 0.29.1, a CUDA
# build that runs on the CPU). Classification needs MMEngine, not MMCV, so
# this environment has no MMCV build. Its other packages are pinned by
# constraints-real.txt. Idempotent: a finished install is kept.
#   bash tools/install_real_models_env.sh [VENV=.venv-real] [PYTHON=python3]
set -euo pipefail
VENV="${1:-.venv-real}"
PYTHON="${2:-python3}"
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
STAMP="$VENV/.real_models_installed"
if [ -f "$STAMP" ]; then
  echo "[install-real] $VENV ready"
  exit 0
fi
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
# every other package at the version tests/real_models passed with
PIP=("$VENV/bin/python" -m pip install -q -c "$ROOT/constraints-real.txt")
echo "[install-real] torch 2.14.1 + torchvision 0.29.1, timm, safetensors"
"${PIP[@]}" torch==2.14.1 torchvision==0.29.1
"${PIP[@]}" timm safetensors 'setuptools<81' mmengine==0.10.7
"${PIP[@]}" --no-build-isolation -e "$ROOT[cls,tests]"
"$VENV/bin/python" -c "import torch, torchvision, timm, safetensors, mmseg_stag; print('[install-real] ok: torch', torch.__version__, '| torchvision', torchvision.__version__, '| timm', timm.__version__)"
touch "$STAMP"
