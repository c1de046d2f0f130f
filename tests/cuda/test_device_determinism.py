"""Deterministic mode on the device (``tools/test.py --seed 3
--deterministic``, i.e. ``randomness=dict(seed=3, deterministic=True)``):
two runs give the same results and the same adapted weights, bit for bit,
for classification (a tiny CNN) and segmentation (a tiny SegFormer: on
CUDA its resizes take deterministic paths, docs/running.md)."""
import json
import os.path as osp

import pytest
import torch
from cuda_runs import (DEVICES, cls_options, config_of, run_tool, seg_options,
                       tool_args, tool_config)
from run_helpers import numbers


def results(work_dir):
    """The run's numbers, without its provenance (its wall time)."""
    with open(osp.join(str(work_dir), 'continual_results.json')) as f:
        return numbers(json.load(f))


@pytest.mark.parametrize('task', ['classification', 'segmentation'])
@pytest.mark.parametrize('device', DEVICES)
def test_two_deterministic_runs_are_equal(task, device, request, tmp_path):
    if task == 'classification':
        checkpoint = request.getfixturevalue('cnn_checkpoint')
        opts = cls_options('tent-stag',
                           request.getfixturevalue('cifar_stream'))
    else:
        checkpoint = request.getfixturevalue('confident_checkpoint')
        opts = seg_options('tent-stag', request.getfixturevalue('tiny_acdc'))
    config, opts = tool_config(config_of('tent-stag', task), tmp_path, task,
                               opts)
    for name in ('a', 'b'):
        proc = run_tool(tool_args(config, checkpoint, tmp_path / name, opts,
                                  '--seed', '3', '--deterministic'), device)
        assert proc.returncode == 0, proc.stderr[-4000:]
    assert results(tmp_path / 'a') == results(tmp_path / 'b')
    a, b = [torch.load(tmp_path / name / 'adapted.pth',
                       weights_only=True)['state_dict'] for name in 'ab']
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key
