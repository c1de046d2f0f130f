"""The oldest Python and torch the package runs on, checked at import.

``setup.py``'s ``python_requires`` and ``install_requires`` and
``tools/install_env.sh`` name the same floors; an older environment (pip's
``--no-deps``, a torch installed afterwards) is refused when ``mmseg_stag``
is imported, naming the installed and the needed version, not deep in a
run with an ``AttributeError``.
"""
import re
import sys
from typing import Optional, Sequence, Tuple

#: ``str.removeprefix`` (benchmarks/pytest_stream.py)
MIN_PYTHON = (3, 9)
#: the newest torch API the package calls: ``torch.amp.GradScaler(device)``
#: (2.3, core/methods/base.py); below it ``torch.load(mmap=...)`` and
#: ``torch._foreach_copy_`` (2.1). A floor of the API, not of testing: the
#: tested torch are 2.11 (the GPU reports) and 2.13 and 2.14 (CPU, the
#: tests), docs/get-started.md "What ran where"
MIN_TORCH = (2, 3)
#: what each floor is for, in the messages
PYTHON_NEEDS = 'str.removeprefix'
TORCH_NEEDS = 'torch.amp.GradScaler(device) (2.3)'


def release(version: str) -> Tuple[int, int]:
    """``(major, minor)`` of a version string such as ``'2.4.1+cu121'`` or
    ``'2.5.0a0+git1234'`` (a pre-release counts as its release).

    Raises:
        ValueError: If ``version`` does not start with ``major.minor``.
    """
    match = re.match(r'(\d+)\.(\d+)', str(version))
    if match is None:
        raise ValueError(f'cannot read a version from {version!r}')
    return int(match.group(1)), int(match.group(2))


def version_string(version: Sequence[int]) -> str:
    return '.'.join(str(v) for v in version)


def check_versions(python_version: Optional[Sequence[int]] = None,
                   torch_version: Optional[str] = None) -> None:
    """Raise ``ImportError`` if Python or torch is older than the package
    needs; default: the running Python, the imported torch.

    Raises:
        ImportError: Naming the installed and the needed version.
    """
    python = tuple(sys.version_info[:3] if python_version is None
                   else python_version)
    if python[:2] < MIN_PYTHON:
        raise ImportError(
            f'mmseg_stag needs Python >= {version_string(MIN_PYTHON)} '
            f'({PYTHON_NEEDS}); this is Python {version_string(python)}')
    if torch_version is None:
        import torch
        torch_version = torch.__version__
    if release(torch_version) < MIN_TORCH:
        raise ImportError(
            f'mmseg_stag needs torch >= {version_string(MIN_TORCH)} '
            f'({TORCH_NEEDS}); '
            f'torch {torch_version} is installed. Install a newer torch '
            '(docs/get-started.md, "What the set-up installs")')
