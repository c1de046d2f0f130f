"""The oldest Python and torch: ``import mmseg_stag`` refuses older ones,
naming the installed and the needed version; ``setup.py`` and
``tools/install_env.sh`` state the same floors."""
import os.path as osp
import re
import subprocess
import sys

import pytest

from mmseg_stag.versions import MIN_PYTHON, MIN_TORCH, check_versions, release

REPO = osp.dirname(osp.dirname(osp.abspath(__file__)))


def test_versions_are_read_as_major_minor():
    assert release('2.4.0') == (2, 4)
    assert release('2.13.0+cpu') == (2, 13)  # not 2.1 < 2.4
    assert release('2.5.0a0+git1234abc') == (2, 5)
    with pytest.raises(ValueError, match="'nightly'"):
        release('nightly')


def test_this_stack_passes_and_the_floor_itself_passes():
    check_versions()  # the running Python and torch
    check_versions(python_version=MIN_PYTHON + (0, ),
                   torch_version='.'.join(map(str, MIN_TORCH)) + '.0')


def test_an_older_torch_is_refused_naming_both_versions():
    with pytest.raises(ImportError, match=r'needs torch >= 2\.3 .*'
                       r'GradScaler\(device\).*torch 2\.2\.2\+cu121 is '
                       'installed'):
        check_versions(torch_version='2.2.2+cu121')
    with pytest.raises(ImportError, match=r'torch 1\.13\.1 is installed'):
        check_versions(torch_version='1.13.1')


def test_an_older_python_is_refused_naming_both_versions():
    with pytest.raises(ImportError, match=r'needs Python >= 3\.9 '
                       r'\(str\.removeprefix\); this is Python 3\.8\.18'):
        check_versions(python_version=(3, 8, 18))


def test_import_mmseg_stag_refuses_an_older_torch():
    """In a fresh interpreter whose torch claims 2.2.2, ``import
    mmseg_stag`` fails with the message, before the package's modules."""
    code = '\n'.join([
        'import sys, torch',
        "torch.__version__ = '2.2.2'",
        'try:',
        '    import mmseg_stag',
        'except ImportError as err:',
        '    print(err)',
        "    print('core imported:', 'mmseg_stag.core' in sys.modules)",
        '    sys.exit(3)'])
    proc = subprocess.run([sys.executable, '-c', code], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 3, proc.stderr[-2000:]
    message, imported = proc.stdout.strip().splitlines()
    assert message.startswith('mmseg_stag needs torch >= 2.3 (')
    assert message.count('torch 2.2.2 is installed') == 1
    assert imported == 'core imported: False'


def test_setup_and_install_script_state_the_same_floors():
    setup = open(osp.join(REPO, 'setup.py'), encoding='utf-8').read()
    floor = '.'.join(map(str, MIN_TORCH))
    assert re.search(r"python_requires='>=(\d+\.\d+)'", setup).group(1) == \
        '.'.join(map(str, MIN_PYTHON))
    assert re.findall(r"'torch>=([\d.]+)'", setup) == [floor]
    script = open(osp.join(REPO, 'tools', 'install_env.sh'),
                  encoding='utf-8').read()
    assert re.search(r'^TORCH_MIN=([\d.]+)$', script, re.M).group(1) == floor
    assert 'version_ok torch "$TORCH_MIN" 3.0' in script
