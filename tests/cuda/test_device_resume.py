"""Resume on the device: a run of ``tools/test.py --deterministic``
SIGKILLed in its third stage and resumed equals the uninterrupted run, bit
for bit (results and adapted weights), for classification (a tiny CNN)
and segmentation (a tiny SegFormer); and the restored state is the saved
one, on the run's device."""
import json
import os.path as osp
import signal

import pytest
import torch
from cuda_runs import (DEVICES, Run, assert_finite_on, cls_options, config_of,
                       run_tool, seg_options, tensors_of, tool_args,
                       tool_config, use_device)
from run_helpers import numbers

from mmseg_stag.engine.run_state import STATE_FILE

#: before the 2nd batch of the 3rd stage: 2 stages (4 batches) saved
KILL = '2,2'


def results(work_dir):
    """The run's numbers, without its provenance (its wall time)."""
    with open(osp.join(str(work_dir), 'continual_results.json')) as f:
        return numbers(json.load(f))


def adapted(work_dir):
    return torch.load(osp.join(str(work_dir), 'adapted.pth'),
                      weights_only=True)['state_dict']


def assert_same_tensors(a, b):
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key


@pytest.mark.parametrize('task', ['classification', 'segmentation'])
@pytest.mark.parametrize('device', DEVICES)
def test_killed_run_resumes_to_the_uninterrupted_run(task, device, request,
                                                     tmp_path):
    if task == 'classification':
        batches = 6
        checkpoint = request.getfixturevalue('cnn_checkpoint')
        opts = cls_options('tent-stag',
                           request.getfixturevalue('cifar_stream'))
    else:
        batches = 8
        checkpoint = request.getfixturevalue('confident_checkpoint')
        opts = seg_options('tent-stag', request.getfixturevalue('tiny_acdc'))
    config, opts = tool_config(config_of('tent-stag', task), tmp_path, task,
                               opts)
    extra = ('--seed', '3', '--deterministic')
    whole, cut = tmp_path / 'whole', tmp_path / 'cut'
    proc = run_tool(tool_args(config, checkpoint, whole, opts, *extra),
                    device)
    assert proc.returncode == 0, proc.stderr[-4000:]
    proc = run_tool(tool_args(config, checkpoint, cut, opts, *extra), device,
                    KILL_AT_STAGE=KILL)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]
    saved = torch.load(osp.join(str(cut), STATE_FILE), weights_only=True)
    assert saved['batches_done'] == 4
    proc = run_tool(tool_args(config, checkpoint, cut, opts, *extra,
                              '--resume'), device)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert f'4 of {batches} batches done' in proc.stdout + proc.stderr
    assert results(cut) == results(whole)
    assert_same_tensors(adapted(whole), adapted(cut))


@pytest.mark.parametrize('method', ['eata-stag', 'cotta-stag'])
@pytest.mark.parametrize('device', DEVICES)
def test_restored_state_lies_on_the_device(method, device, tiny_acdc,
                                           tiny_cityscapes,
                                           confident_checkpoint, tmp_path,
                                           monkeypatch):
    """A finished run resumed: every restored tensor of the method (the
    model's, the optimizer's moments, EATA's Fisher information and p̄,
    CoTTA's teacher) is the saved value, on the run's device."""
    use_device(monkeypatch, device)
    opts = seg_options(method, tiny_acdc, tiny_cityscapes)
    Run(config_of(method), confident_checkpoint, tmp_path, opts)
    saved = torch.load(tmp_path / STATE_FILE, weights_only=True)['method']
    resumed = Run(config_of(method), confident_checkpoint, tmp_path,
                  dict(opts, **{'test_cfg.resume': True}))
    assert_finite_on(resumed.model, device)
    restored = dict(tensors_of(resumed.method.state_dict()))
    expected = dict(tensors_of(saved))
    assert restored.keys() == expected.keys()
    on_device = 0
    for path, tensor in restored.items():
        assert torch.equal(tensor.cpu(), expected[path].cpu()), path
        if tensor.dim() > 0:  # optimizers keep scalar steps on the CPU
            assert tensor.device.type == device, (path, tensor.device)
            on_device += 1
    assert on_device > 0
