"""EcoTTA end to end on the tiny CNN (K=4, one part per conv layer): the
warm-up command (loss lowered, resumable per epoch), then ``tools/test.py``
on the paper's EcoTTA config from the warmed-up file (killed and resumed
= uninterrupted, with STAG), and the source file refused before the first
batch unless a cold start is asked for."""
import os
import os.path as osp

import numpy as np
import pytest
import torch
from cls_helpers import (REPO, assert_same_run, killable_config, options,
                         run_tool)
from run_helpers import run_config
from seg_helpers import python_path

from mmseg_stag.classification.ecotta_warmup import warm_up_checkpoint

CONFIG = osp.join(REPO, 'configs/cls/cifar-c/cifar10-c_continual_wrn-28-10_'
                  'ecotta-k4{}.py')
NETWORK = dict(_delete_=True, type='EcoTTANetwork',
               network=dict(type='SmallCNN', num_classes=4, width=4,
                            norm='BN'), K=4)


def ecotta_options(root, names, **extra):
    opts = options(root, names, batch_size=8, **extra)
    opts['model.network'] = dict(NETWORK)
    opts['test_cfg.method.optimizer'] = dict(_delete_=True, type='SGD',
                                             lr=0.05, momentum=0.9)
    return opts


@pytest.fixture
def source_set(tmp_path):
    """64 clean training images of the stream's 4 classes (its class cue:
    the mean intensity)."""
    rng = np.random.default_rng(3)
    labels = rng.integers(0, 4, 64)
    base = (labels[:, None, None, None] * 50 + 30).astype(np.float64)
    images = np.clip(base + rng.normal(0, 10, (64, 32, 32, 3)), 0, 255)
    np.save(tmp_path / 'train_x.npy', images.astype(np.uint8))
    np.save(tmp_path / 'train_y.npy', labels)
    return str(tmp_path / 'train_x.npy'), str(tmp_path / 'train_y.npy')


@pytest.fixture
def warm(load_tool):
    """``tools/ecotta_warmup.py``'s command on the source set."""
    tool = load_tool('ecotta_warmup')

    def run(config, checkpoint, source_set, out, *extra):
        return tool.main([
            config, checkpoint, '--train-data', source_set[0],
            '--train-labels', source_set[1], '--out', str(out),
            '--batch-size', '16', *extra])

    return run


def test_warmup_lowers_the_loss_and_resumes_per_epoch(tmp_path, stream,
                                                      names, checkpoint,
                                                      source_set, warm):
    _, root = stream
    config = killable_config(CONFIG.format(''),
                             ecotta_options(root, names), tmp_path, kill=False)
    whole = warm(config, checkpoint, source_set, tmp_path / 'w.pth',
                 '--epochs', '3', '--work-dir', str(tmp_path / 'ww'))
    assert whole['after'] < whole['before']
    warm(config, checkpoint, source_set, tmp_path / 'c.pth', '--epochs',
         '1', '--work-dir', str(tmp_path / 'cw'))
    resumed = warm(config, checkpoint, source_set, tmp_path / 'c.pth',
                   '--epochs', '3', '--work-dir', str(tmp_path / 'cw'),
                   '--resume')
    assert resumed['history'] == whole['history']
    a, b = [torch.load(tmp_path / f, weights_only=True)['state_dict']
            for f in ('w.pth', 'c.pth')]
    assert a.keys() == b.keys() and any(k.startswith('ecotta.') for k in a)
    for key in a:
        assert torch.equal(a[key], b[key]), key
    # the frozen network's parameters are the source's
    source = torch.load(checkpoint, weights_only=True)['state_dict']
    for key, value in source.items():
        if 'running' not in key and 'num_batches' not in key:
            assert torch.equal(a[key], value), key
    with pytest.raises(ValueError, match='another warm-up'):
        warm(config, checkpoint, source_set, tmp_path / 'd.pth', '--epochs',
             '3', '--lr', '0.01', '--work-dir', str(tmp_path / 'cw'),
             '--resume')


def test_warmup_on_the_device_asked_for(tmp_path, stream, names,
                                        checkpoint, source_set, warm):
    """``--device cpu``: the model, its batches and the loss there; the
    file holds CPU tensors and names the device."""
    _, root = stream
    config = killable_config(CONFIG.format(''),
                             ecotta_options(root, names), tmp_path, kill=False)
    res = warm(config, checkpoint, source_set, tmp_path / 'w.pth',
               '--epochs', '1', '--work-dir', str(tmp_path / 'ww'),
               '--device', 'cpu')
    assert res['after'] < res['before']
    warmed = torch.load(tmp_path / 'w.pth', weights_only=True)
    assert warmed['meta']['ecotta_warmup']['device'] == 'cpu'
    assert {v.device.type for v in warmed['state_dict'].values()} == {'cpu'}


def test_a_cuda_warmup_without_cuda_is_refused_before_any_work(
        tmp_path, monkeypatch, checkpoint, source_set, warm, capsys):
    """``--device cuda`` where torch sees no CUDA device: the command stops
    at its arguments, naming the option, with nothing written; the function
    raises before it reads the config or the training set."""
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: False)
    out, work_dir = tmp_path / 'w.pth', tmp_path / 'ww'
    with pytest.raises(SystemExit) as stop:
        warm(CONFIG.format(''), checkpoint, source_set, out, '--work-dir',
             str(work_dir), '--device', 'cuda')
    assert stop.value.code == 2  # argparse's error
    err = capsys.readouterr().err
    assert "--device: EcoTTA warm-up: device='cuda', but torch sees no " \
        'CUDA device' in err and 'use --device cpu' in err
    assert not out.exists() and not work_dir.exists()
    with pytest.raises(ValueError, match="device='cuda:0', but torch sees "
                       'no CUDA device'):
        warm_up_checkpoint(str(tmp_path / 'no_config.py'), checkpoint,
                           str(out), str(tmp_path / 'no_data.npy'),
                           str(work_dir), device='cuda:0')
    assert not out.exists() and not work_dir.exists()


def test_stream_from_the_warmed_up_file_resumes_exactly(tmp_path, stream,
                                                        names, checkpoint,
                                                        source_set, warm):
    """EcoTTA+STAG killed in its third stage and resumed = uninterrupted
    (results and every tensor of the adapted network); the log has EcoTTA's
    and STAG's losses."""
    _, root = stream
    config = killable_config(CONFIG.format('-stag'),
                             ecotta_options(root, names), tmp_path)
    warmed = tmp_path / 'warm.pth'
    warm(config, checkpoint, source_set, warmed, '--epochs', '1',
         '--work-dir', str(tmp_path / 'wd'))
    env = dict(os.environ, PYTHONPATH=python_path(
        osp.join(REPO, 'tests'), REPO))
    whole, cut = tmp_path / 'whole', tmp_path / 'cut'
    proc = run_tool(config, str(warmed), '--work-dir', str(whole),
                    '--save-adapted', str(whole / 'adapted.pth'), env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    log = open(next(whole.rglob('*.log'))).read()
    for key in ('loss_reg:', 'loss_stag:', 'beta:', 'num_reliable:'):
        assert key in log, key
    killed = run_tool(config, str(warmed), '--work-dir', str(cut),
                      env=dict(env, KILL_AT_STAGE='2,3'))
    assert killed.returncode != 0
    resumed = run_tool(config, str(warmed), '--work-dir', str(cut),
                       '--resume', '--save-adapted',
                       str(cut / 'adapted.pth'), env=env)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    pa = assert_same_run(whole, cut)
    warm_state = torch.load(warmed, weights_only=True)['state_dict']
    changed = {k for k in pa if k.startswith('network.') and
               not torch.equal(pa[k], warm_state[k[len('network.'):]])}
    assert changed and all(k.startswith('network.ecotta.') or 'running' in k
                           or 'num_batches' in k for k in changed)


def test_source_file_is_refused_unless_cold_start(tmp_path, stream, names,
                                                  checkpoint):
    _, root = stream
    opts = ecotta_options(root, names)
    with pytest.raises(ValueError, match='tools/ecotta_warmup.py'):
        run_config(CONFIG.format(''), checkpoint, str(tmp_path / 'a'), opts)
    assert not (tmp_path / 'a' / 'continual_results.json').exists()
    opts['model.network.allow_cold_start'] = True
    run_config(CONFIG.format(''), checkpoint, str(tmp_path / 'b'), opts)
    assert (tmp_path / 'b' / 'continual_results.json').is_file()
