"""tools/benchmark_loop.py on the tiny stream: images/s per method, the
classifier calls per image (one for our TENT, two for the two-forward
reference), and the reference predicts what TENT predicts. No timing is
asserted."""
import json
import os.path as osp
import sys

import pytest
from seg_helpers import REPO, SEG_CFG, as_cli, run_script, tiny_options


def test_loop_benchmark(tiny_acdc, tiny_checkpoint, tmp_path):
    out = tmp_path / 'loop.json'
    opts = tiny_options(tiny_acdc, rounds=1)
    opts.pop('test_dataloader.dataset.data_root')
    proc = run_script(
        [sys.executable, osp.join(REPO, 'tools/benchmark_loop.py'),
         tiny_checkpoint, '--data-root', tiny_acdc, '--config-pattern',
         SEG_CFG, '--methods', 'tent', 'tent-stag', 'two-forward',
         '--images', '6', '--warmup', '2', '--out', str(out),
         '--cfg-options'] + as_cli(opts), cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-4000:]
    res = json.loads(out.read_text())['methods']
    assert {m: r['images'] for m, r in res.items()} == \
        {'tent': 6, 'tent-stag': 6, 'two-forward': 6}
    assert res['tent']['classifier_calls_per_image'] == 1
    assert res['tent-stag']['classifier_calls_per_image'] == 1
    assert res['two-forward']['classifier_calls_per_image'] == 2
    assert res['two-forward']['mIoU'] == res['tent']['mIoU']
    assert all(r['images_per_second'] > 0 for r in res.values())
    reference = res['two-forward']['images_per_second']
    for method in ('tent', 'tent-stag'):  # images/s over the reference's
        assert res[method]['ratio_to_two_forward'] == pytest.approx(
            res[method]['images_per_second'] / reference)
    assert 'vs two-fwd' in proc.stdout


def test_loop_benchmark_bad_input(tiny_acdc, tiny_checkpoint, tmp_path):
    cmd = [sys.executable, osp.join(REPO, 'tools/benchmark_loop.py')]
    proc = run_script(cmd + [str(tmp_path / 'nope.pth'), '--data-root',
                             tiny_acdc], cwd=REPO)
    assert proc.returncode != 0 and 'checkpoint file not found' in \
        proc.stderr
    proc = run_script(cmd + [tiny_checkpoint, '--data-root',
                             str(tmp_path / 'none')], cwd=REPO)
    assert '--data-root is not a folder' in proc.stderr
    proc = run_script(cmd + [tiny_checkpoint, '--data-root', tiny_acdc,
                             '--methods', 'tnet'], cwd=REPO)
    assert "no config for 'tnet'" in proc.stderr


def test_importing_the_benchmark_registers_no_method():
    """The two-forward reference goes into ``METHODS`` for the run that
    uses it (``build_runner``), not when its module is imported."""
    code = ('import benchmarks.loop_benchmark\n'
            'from mmseg_stag.core import METHODS\n'
            "print('tent_two_forward' in METHODS.module_dict)")
    proc = run_script([sys.executable, '-c', code], cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert proc.stdout.split()[-1] == 'False'


def test_a_graph_run_counts_no_classifier_calls(tiny_acdc, tiny_checkpoint,
                                                tmp_path, monkeypatch):
    """A replayed graph runs no Python hook: counted, its classifier calls
    per image would be those of its 2 eager steps and its capture over all
    its images (≈ 0.03 on 400 images); the row says None instead, and the
    eager run's count is 1."""
    import argparse

    from benchmarks import loop_benchmark, stand_in_graph
    stand_in_graph.install(monkeypatch, loop=True)
    opts = tiny_options(tiny_acdc, rounds=1)
    opts.pop('test_dataloader.dataset.data_root')
    args = argparse.Namespace(
        checkpoint=tiny_checkpoint, data_root=tiny_acdc,
        config_pattern=osp.join(REPO, SEG_CFG), images=6, warmup=2,
        cfg_options=dict(opts, **{'test_cfg.cuda_graph': True}))
    graph = loop_benchmark.run_method('tent-stag', args, str(tmp_path / 'g'))
    args.cfg_options['test_cfg.cuda_graph'] = False
    eager = loop_benchmark.run_method('tent-stag', args, str(tmp_path / 'e'))
    assert graph['images'] == eager['images'] == 6
    assert graph['classifier_calls_per_image'] is None
    assert eager['classifier_calls_per_image'] == 1
