# Set-up and the two main jobs. `make demo` and `make test` create the
# virtualenv and install the stack when needed (tools/install_env.sh), once.
VENV ?= .venv
PYTHON ?= python3
PY := $(VENV)/bin/python
STAMP := $(VENV)/.mmseg_stag_installed

.PHONY: install demo demo-cls test clean-venv

install: $(STAMP)

$(STAMP): setup.py tools/install_env.sh
	bash tools/install_env.sh $(VENV) $(PYTHON)
	touch $(STAMP)

demo: $(STAMP)
	$(PY) tools/demo.py --work-dir work_dirs/demo

demo-cls: $(STAMP)
	$(PY) tools/demo_cls.py --work-dir work_dirs/demo_cls

test: $(STAMP)
	$(PY) -m pytest

clean-venv:
	rm -rf $(VENV)
