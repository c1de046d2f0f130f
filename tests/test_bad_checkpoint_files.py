"""A bad checkpoint file is named in one sentence, not a traceback: an
empty file, a ``torch.save`` file cut in half, a web page saved as
``.pth`` (what a dead download link returns) and random bytes, through
the loader (with and without ``allow_unsafe_pickle``),
``tools/convert_nvlabs_segformer.py`` and ``tools/check_setup.py``; only
a pickle that really holds Python objects is told ``--trust-pickle``
(``tests/test_checkpoint.py``)."""
import os.path as osp
import random

import pytest
import torch
from seg_helpers import REPO, SEG_CFG, as_cli, tiny_options

from mmseg_stag.checkpoint import UNSAFE_HINT, load_checkpoint_file

KINDS = ('empty', 'truncated', 'html', 'random')
#: the stand-in's image counts (tests/tools/test_check_setup.py)
EXPECTED = osp.join(REPO, 'tests', 'tools', 'check_setup_stand_in.json')
HTML = (b'<!DOCTYPE html>\n<html><head><title>404 Not Found</title></head>'
        b'<body><h1>Not Found</h1></body></html>\n')


def write_bad(tmp_path, kind):
    """The bad file of ``kind`` and the words its sentence must hold."""
    path = tmp_path / f'{kind}.pth'
    if kind == 'empty':
        path.write_bytes(b'')
        return str(path), 'is empty (0 bytes)'
    if kind == 'truncated':
        torch.save({'state_dict': {'w': torch.arange(4096.)}}, path)
        data = path.read_bytes()
        path.write_bytes(data[:len(data) // 2])
        return str(path), f'is cut short or damaged ({len(data) // 2} bytes)'
    if kind == 'html':
        path.write_bytes(HTML)
        return str(path), 'is a web page / text'
    data = b'\x07' + random.Random(0).randbytes(999)  # no magic, no text
    path.write_bytes(data)
    return str(path), f'cannot load checkpoint {path} (1000 bytes): '


def assert_one_sentence(message, path, words):
    assert path in message and words in message, message
    assert '\n' not in message.strip(), message
    assert 'trust-pickle' not in message and UNSAFE_HINT not in message
    assert 'Traceback' not in message
    if words == 'is a web page / text':
        assert 'the download failed' in message


@pytest.mark.parametrize('unsafe', [False, True], ids=['safe', 'unsafe'])
@pytest.mark.parametrize('kind', KINDS)
def test_the_loader_names_the_bad_file(tmp_path, kind, unsafe):
    path, words = write_bad(tmp_path, kind)
    with pytest.raises(RuntimeError) as err:
        load_checkpoint_file(path, allow_unsafe_pickle=unsafe)
    assert_one_sentence(str(err.value), path, words)


@pytest.mark.parametrize('trust', [[], ['--trust-pickle']],
                         ids=['safe', 'trust-pickle'])
@pytest.mark.parametrize('kind', KINDS)
def test_the_converter_says_error_and_exits(tmp_path, load_tool, kind,
                                            trust):
    path, words = write_bad(tmp_path, kind)
    dst = tmp_path / 'out' / 'mm.pth'
    with pytest.raises(SystemExit) as exit_:
        load_tool('convert_nvlabs_segformer').main([path, str(dst), *trust])
    message = exit_.value.code
    assert isinstance(message, str) and message.startswith('error: ')
    assert_one_sentence(message, path, words)
    assert not dst.exists()


@pytest.mark.parametrize('kind', KINDS)
def test_check_setup_fails_the_checkpoint_naming_it(
        tiny_acdc, tmp_path, capsys, load_tool, kind):
    path, words = write_bad(tmp_path, kind)
    opts = tiny_options(tiny_acdc, rounds=1)
    del opts['test_dataloader.dataset.data_root']
    status = load_tool('check_setup').main(
        [osp.join(REPO, SEG_CFG.format('source')), path, '--no-run',
         '--expected', EXPECTED, '--data-root', tiny_acdc,
         '--cfg-options'] + as_cli(opts))
    out = capsys.readouterr().out
    assert status == 1
    assert '[FAIL] checkpoint' in out and '[PASS] data' in out
    (line, ) = [x for x in out.splitlines() if x.startswith('  - ')]
    assert_one_sentence(line[len('  - '):], path, words)
