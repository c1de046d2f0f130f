"""CoTTA, EATA, SAR and DeYO (each with and without STAG) through
``tools/test.py`` with the real configs shrunk by ``--cfg-options`` on the
tiny stream: one result per stage, the parameters each method should touch
and no others (``--save-adapted``), its counts in the log."""
import json
import os.path as osp
import re
import sys

import pytest
import torch
from seg_helpers import (REPO, SEG_CFG, as_cli, build_from_config,
                         eata_source_options, run_script, tiny_options)
from torch.nn.modules.batchnorm import _BatchNorm

METHODS = ('cotta', 'eata', 'sar', 'deyo')
#: the counts each method logs per batch (pixels for the filters)
COUNTS = dict(cotta=('confident_pixels', 'num_views'),
              eata=('num_reliable', 'num_selected', 'loss_ewc'),
              sar=('num_kept1', 'num_kept2', 'recovered', 'ema'),
              deyo=('num_reliable', 'num_selected'))
#: CoTTA's views on the tiny stream: 6 views (3 ratios x flip)
VIEWS = {'test_dataloader.dataset.pipeline.1.scale': (128, 64),
         'test_dataloader.dataset.pipeline.1.ratios': [0.5, 1.0, 1.5]}


def options(method, tiny_acdc, tiny_cityscapes):
    opts = tiny_options(tiny_acdc, rounds=1)
    if method.startswith('cotta'):
        opts.update(VIEWS)
    if method.startswith('eata'):
        opts.update(eata_source_options(tiny_cityscapes))
    return opts


@pytest.fixture(scope='module')
def runs(tiny_acdc, tiny_cityscapes, confident_checkpoint, tmp_path_factory):
    """Each config once through tools/test.py (subprocesses are slow)."""
    done = {}

    def run(method):
        if method not in done:
            work_dir = tmp_path_factory.mktemp(method)
            adapted = work_dir / 'adapted.pth'
            proc = run_script(
                [sys.executable, osp.join(REPO, 'tools/test.py'),
                 osp.join(REPO, SEG_CFG.format(method)), confident_checkpoint,
                 '--work-dir', str(work_dir), '--save-adapted', str(adapted),
                 '--cfg-options'] +
                as_cli(options(method, tiny_acdc, tiny_cityscapes)),
                cwd=REPO)
            assert proc.returncode == 0, proc.stderr[-4000:]
            done[method] = (proc.stdout + proc.stderr, work_dir, adapted)
        return done[method]

    return run


def norm_affine_names(tiny_acdc):
    model, _ = build_from_config(SEG_CFG.format('tent'),
                                 tiny_options(tiny_acdc))
    return {f'{name}.{p}' for name, m in model.named_modules()
            if isinstance(m, (torch.nn.LayerNorm, _BatchNorm))
            for p in ('weight', 'bias')}


@pytest.mark.parametrize('stag', ['', '-stag'])
@pytest.mark.parametrize('method', METHODS)
def test_method_through_tools_test_py(method, stag, runs, tiny_acdc,
                                      confident_checkpoint):
    log, work_dir, adapted = runs(method + stag)
    # one result per stage
    with open(osp.join(str(work_dir), 'continual_results.json')) as f:
        stages = json.load(f)['stages']
    assert [s['condition'] for s in stages] == ['fog', 'night', 'rain',
                                                'snow']
    assert [s['num_images'] for s in stages] == [2] * 4
    # the counts (and STAG's terms) in every log line of the stream
    lines = [line
             for line in re.findall(r'Iter\(test\) \[\s*\d+/8\].*', log)
             if 'continual/mIoU' not in line]
    assert len(lines) == 8
    # SAR reports each of its two passes (1, 2)
    stag_keys = ('loss_stag1', 'loss_stag2') if method == 'sar' else (
        'loss_stag', 'beta')
    keys = COUNTS[method] + (stag_keys if stag else ())
    for key in keys:
        assert all(f'{key}: ' in line for line in lines), (key, lines[0])
    # the parameters it should touch, and no others
    before = torch.load(confident_checkpoint, weights_only=True)['state_dict']
    after = torch.load(str(adapted), weights_only=True)['state_dict']
    assert set(after) == set(before)
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    allowed = {k for k, v in before.items() if v.is_floating_point()} - {
        k for k in before if 'running_' in k}  # every parameter
    if method != 'cotta':
        allowed = norm_affine_names(tiny_acdc)
    assert changed and changed <= allowed, sorted(changed - allowed)
    if method == 'cotta':  # every parameter is trained (and restored)
        assert 'backbone.layers.0.0.projection.weight' in changed
        assert 'decode_head.conv_seg.weight' in changed


def test_eata_needs_its_source_data_before_the_first_image(
        runs, tiny_acdc, tiny_cityscapes, confident_checkpoint, tmp_path):
    log, _, _ = runs('eata')
    assert 'EATA: statistics of 4 clean source images' in log
    opts = options('eata', tiny_acdc, tiny_cityscapes)
    opts['test_cfg.source_dataloader.dataset.data_root'] = str(
        tmp_path / 'no_cityscapes')
    proc = run_script(
        [sys.executable, osp.join(REPO, 'tools/test.py'),
         osp.join(REPO, SEG_CFG.format('eata')), confident_checkpoint,
         '--work-dir', str(tmp_path / 'w'), '--cfg-options'] + as_cli(opts),
        cwd=REPO)
    assert proc.returncode != 0
    assert 'no_cityscapes' in proc.stderr
    assert not (tmp_path / 'w' / 'continual_results.json').exists()
