# Set-up and the two main jobs. `make demo` and `make test` create the
# virtualenv and install the stack when needed (tools/install_env.sh), once.
VENV ?= .venv
PYTHON ?= python3
PY := $(VENV)/bin/python
STAMP := $(VENV)/.mmseg_stag_installed
# the real classifiers (torchvision, timm) need a torch with a torchvision
# wheel: a second environment, without MMCV (tools/install_real_models_env.sh)
VENV_REAL ?= .venv-real
STAMP_REAL := $(VENV_REAL)/.real_models_installed

.PHONY: install demo demo-hybrid demo-cls demo-cls-hard docs lint test clean-venv gpu-check

install: $(STAMP)

# The stamp holds the torch version the stack was installed for: a changed
# torch, or an MMCV whose compiled ops no longer load, installs again
# (docs/faq.md, "mmcv._ext").
ENV_OK := $(shell test -f $(STAMP) && $(PY) -c "import sys, torch, mmcv._ext; sys.exit(open('$(STAMP)').read().strip() != torch.__version__)" >/dev/null 2>&1 && echo ok)
ifneq ($(ENV_OK),ok)
.PHONY: $(STAMP)
endif

$(STAMP): setup.py tools/install_env.sh constraints.txt
	bash tools/install_env.sh $(VENV) $(PYTHON)
	$(PY) -c "import torch; print(torch.__version__)" > $(STAMP)

demo: $(STAMP)
	$(PY) tools/demo.py --work-dir work_dirs/demo

# beyond the paper: Hybrid-TTA +/- STAG beside Source and TENT +/- STAG
demo-hybrid: $(STAMP)
	$(PY) tools/demo.py --work-dir work_dirs/demo_hybrid --methods source tent tent-stag hybrid-tta hybrid-tta-stag

demo-cls: $(STAMP)
	$(PY) tools/demo_cls.py --work-dir work_dirs/demo_cls

# Table label_shifts_bs1's scenarios: label shift (ratio inf), batch size 1
demo-cls-hard: $(STAMP)
	$(PY) tools/demo_cls.py --work-dir work_dirs/demo_cls --scenarios label-shift bs1

$(STAMP_REAL): setup.py tools/install_real_models_env.sh constraints-real.txt
	rm -f $(STAMP_REAL)
	bash tools/install_real_models_env.sh $(VENV_REAL) $(PYTHON)

# pyflakes and pycodestyle over the package, tools, tests, benchmarks and
# configs (ruff.toml): unused or duplicate imports, undefined names, style;
# then the imports' order, OpenMMLab's isort settings (.isort.cfg)
lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/isort --check-only --diff --quiet .

# the documentation site; strict (mkdocs.yml): a broken link fails
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

# the main suite in TEST_WORKERS processes (pytest-xdist; an idle one takes
# the other's queued tests); TEST_WORKERS=0 runs it in this process
TEST_WORKERS ?= 2
test: $(STAMP) $(STAMP_REAL) lint
	$(PY) -m pytest -n $(TEST_WORKERS) --dist worksteal
	MMSEG_STAG_REAL_MODELS=required $(VENV_REAL)/bin/python -m pytest tests/real_models
	$(MAKE) docs

# on one CUDA GPU (docs/benchmark.md, "GPU check"): first whether the fast
# path is right (--first-contact, ~6 min: first_contact.md), then the cuda
# tests and the GPU measurements (gpu_check.md), both in work_dirs/gpu_check;
# fails without a GPU, or when either part fails
gpu-check: $(STAMP)
	$(PY) tools/gpu_check.py --first-contact --out-dir work_dirs/gpu_check; \
	first=$$?; $(PY) tools/gpu_check.py --out-dir work_dirs/gpu_check && \
	exit $$first

clean-venv:
	rm -rf $(VENV) $(VENV_REAL)
