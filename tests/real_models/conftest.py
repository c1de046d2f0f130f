"""The real classifiers' tests run where torchvision and timm import (the
``.venv-real`` environment that ``make test`` builds and uses). Elsewhere
they are skipped with the reason, unless ``MMSEG_STAG_REAL_MODELS=required``
(set by ``make test``): then a missing library is a failure."""
import importlib
import os

import pytest

REQUIRED = os.environ.get('MMSEG_STAG_REAL_MODELS') == 'required'


def need(module: str):
    """Import ``module`` or skip the calling test module (fail when the
    real-model environment is required)."""
    try:
        return importlib.import_module(module)
    except Exception as err:  # torchvision fails with RuntimeError too
        if REQUIRED:
            raise
        pytest.skip(f'{module} cannot be imported here ({type(err).__name__}'
                    f': {err}); the real-model tests run in .venv-real '
                    '(tools/install_real_models_env.sh, make test)',
                    allow_module_level=True)
