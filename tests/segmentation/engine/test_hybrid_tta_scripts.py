"""Hybrid-TTA from the command line, with the real configs shrunk by
``--cfg-options``: our ``tools/test.py`` and MMSeg's packaged one give the
same numbers; a run SIGKILLed mid-stream and resumed equals the
uninterrupted run (the teacher, the switch and the mask generator
included); the plain checkpoint loads and a checkpoint missing backbone
keys is refused naming them."""
import json
import os.path as osp
import re
import signal
import sys

import pytest
import torch
from run_helpers import killable_config
from seg_helpers import (REPO, SEG_CFG, as_cli, mmseg_test_py, python_path,
                         run_script, tiny_options)

from mmseg_stag.engine.run_state import STATE_FILE

CONFIG = osp.join(REPO, SEG_CFG.format('hybrid-tta-stag'))
#: 64x32 inputs: 8-px mask patches; a small neck; a switch that tunes
#: both ways on the tiny stream
HYBRID = {'test_cfg.method.mask_patch_size': 8,
          'test_cfg.method.neck_embed_dim': 16,
          'test_cfg.method.switch.window': 2,
          'test_cfg.method.switch.margin': -0.05,
          'test_cfg.method.switch.momentum': 0.0}
NEW_MODULES = re.compile(r'\.ffn\.adapter\.|^backbone\.mask_token_embed\.|'
                         r'^recon_neck\.')


def options(tiny_acdc, rounds=1):
    return dict(tiny_options(tiny_acdc, rounds=rounds), **HYBRID)


def run_test_py(script, config, checkpoint, work_dir, opts, *extra,
                kill=None):
    env = dict(PYTHONPATH=python_path(osp.join(REPO, 'tests')))
    if kill:
        env['KILL_AT_STAGE'] = kill
    return run_script([sys.executable, script, config, checkpoint,
                       '--work-dir', str(work_dir), *extra, '--cfg-options']
                      + as_cli(opts), cwd=REPO, **env)


def scores(work_dir):
    with open(osp.join(str(work_dir), 'continual_results.json')) as f:
        return [s['score'] for s in json.load(f)['stages']]


@pytest.fixture(scope='module')
def ours(tiny_acdc, tiny_checkpoint, tmp_path_factory):
    work_dir = tmp_path_factory.mktemp('hybrid_ours')
    proc = run_test_py(osp.join(REPO, 'tools/test.py'), CONFIG,
                       tiny_checkpoint, work_dir, options(tiny_acdc),
                       '--save-adapted', str(work_dir / 'adapted.pth'))
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc.stdout + proc.stderr, work_dir


def test_tools_test_py(ours, tiny_checkpoint):
    log, work_dir = ours
    assert len(scores(work_dir)) == 4
    assert ('Hybrid-TTA adds modules the source checkpoint does not have, '
            'from their initialisation: 4 parallel adapters') in log
    lines = [line for line in re.findall(r'Iter\(test\) \[\s*\d+/8\].*', log)
             if 'continual/mIoU' not in line]
    assert len(lines) == 8
    for key in ('loss_seg', 'loss_recon', 'efficient', 'loss_stag', 'beta'):
        assert all(f'{key}: ' in line for line in lines), (key, lines[0])
    modes = {re.search(r'efficient: (\S+)', line).group(1)
             for line in lines}
    assert modes == {'0.0000', '1.0000'}
    # the student: the checkpoint's keys, all trained, and the new modules
    before = torch.load(tiny_checkpoint, weights_only=True)['state_dict']
    after = torch.load(str(work_dir / 'adapted.pth'),
                       weights_only=True)['state_dict']
    new = set(after) - set(before)
    assert new and all(NEW_MODULES.search(k) for k in new)
    assert not torch.equal(before['decode_head.conv_seg.weight'],
                           after['decode_head.conv_seg.weight'])


def test_mmseg_test_script_gives_the_same_numbers(ours, tiny_acdc,
                                                  tiny_checkpoint, tmp_path):
    proc = run_test_py(mmseg_test_py(), CONFIG, tiny_checkpoint, tmp_path,
                       options(tiny_acdc))
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert scores(tmp_path) == scores(ours[1])


def test_killed_run_resumes_to_the_uninterrupted_result(
        tiny_acdc, tiny_checkpoint, tmp_path):
    opts = options(tiny_acdc, rounds=2)
    config = killable_config(CONFIG, {}, tmp_path, name='hybrid_killable.py')
    whole, cut = tmp_path / 'whole', tmp_path / 'cut'
    script = osp.join(REPO, 'tools/test.py')
    proc = run_test_py(script, config, tiny_checkpoint, whole, opts)
    assert proc.returncode == 0, proc.stderr[-4000:]
    proc = run_test_py(script, config, tiny_checkpoint, cut, opts,
                       kill='3,2')
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]
    proc = run_test_py(script, config, tiny_checkpoint, cut, opts,
                       '--resume')
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert '6 of 16 batches done' in proc.stdout + proc.stderr
    assert scores(cut) == scores(whole)
    a, b = (torch.load(osp.join(str(d), STATE_FILE),
                       weights_only=True)['method'] for d in (whole, cut))
    for part in ('model', 'teacher'):
        assert a[part].keys() == b[part].keys()
        for key in a[part]:
            assert torch.equal(a[part][key], b[part][key]), (part, key)
    assert a['switch'] == b['switch']
    assert torch.equal(a['mask_rng']['keys'], b['mask_rng']['keys'])
    assert a['mask_rng']['pos'] == b['mask_rng']['pos']


def test_checkpoint_missing_backbone_keys_is_refused(tiny_acdc,
                                                     tiny_checkpoint,
                                                     tmp_path):
    ckpt = torch.load(tiny_checkpoint, weights_only=True)
    del ckpt['state_dict']['backbone.layers.0.0.projection.weight']
    path = tmp_path / 'cut.pth'
    torch.save(ckpt, path)
    proc = run_test_py(osp.join(REPO, 'tools/test.py'), CONFIG, str(path),
                       tmp_path / 'w', options(tiny_acdc))
    assert proc.returncode != 0
    assert 'missing keys (1): backbone.layers.0.0.projection.weight' in \
        proc.stderr
