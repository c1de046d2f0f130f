"""The core (STAG math and loss, probe, methods) works where MMSeg and MMCV
cannot be imported: a fresh interpreter with both blocked imports it and
runs one TENT+STAG step on a tiny ``nn.Linear`` classifier."""
import json
import os.path as osp
import subprocess
import sys
import textwrap

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
SCRIPT = textwrap.dedent('''
    import json
    import sys

    # ``import mmseg`` / ``import mmcv`` (and their submodules) now raise
    # ImportError, and importlib.util.find_spec('mmseg') returns None
    sys.modules['mmseg'] = None
    sys.modules['mmcv'] = None

    import torch
    import torch.nn as nn

    import mmseg_stag.core as core
    from mmseg_stag.core import (METHODS, Batch, HeadProbe, STAGLoss,
                                 TaskAdapter, build_method, stag)

    out = {}
    names = ('source', 'bn_adapt', 'tent', 'eata', 'sar', 'deyo', 'cotta',
             'ecotta')
    out['methods'] = {n: type(build_method(dict(type=n))).__name__
                      for n in names}
    out['registered'] = sorted(METHODS.module_dict)

    torch.manual_seed(0)
    feats = torch.randn(4, 6)
    fc = nn.Linear(6, 3)
    out['stag_math'] = float(stag.stag_loss(feats, fc(feats), fc.weight,
                                            fc.bias))
    out['stag_loss'] = float(STAGLoss()(feats, fc(feats), fc.weight,
                                        fc.bias))

    model = nn.Sequential(nn.Linear(6, 8), nn.LayerNorm(8), nn.ReLU(),
                          nn.Linear(8, 3)).eval()
    probe = HeadProbe()  # the last nn.Linear
    method = build_method(dict(type='tent', stag=dict(beta0=5.0, gamma=10.0),
                               optimizer=dict(type='SGD', lr=0.5)))
    method.configure(model, TaskAdapter(probe))
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    x = torch.randn(16, 6)
    with torch.set_grad_enabled(method.has_loss):
        prediction, stats = method.adapt(Batch(x))
    out['prediction'] = [type(prediction).__name__,
                         list(prediction.value.shape)]
    out['changed'] = sorted(n for n, p in model.named_parameters()
                            if not torch.equal(p, before[n]))
    out['stats'] = {k: float(v) for k, v in stats.items()}  # 0-d tensors
    out['num_updates'] = method.num_updates
    out['imported'] = sorted(
        m for m, mod in sys.modules.items()
        if m.split('.')[0] in ('mmseg', 'mmcv') and mod is not None)
    print(json.dumps(out))
''')


def test_core_imports_and_adapts_without_mmseg_and_mmcv():
    proc = subprocess.run([sys.executable, '-c', SCRIPT], capture_output=True,
                          text=True, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out['imported'] == []  # neither mmseg nor mmcv really imported
    assert out['methods'] == dict(source='Source', bn_adapt='BNAdapt',
                                  tent='TENT', eata='EATA', sar='SAR',
                                  deyo='DeYO', cotta='CoTTA',
                                  ecotta='EcoTTA')
    assert out['registered'] == sorted(out['methods'])
    assert out['stag_math'] == out['stag_loss']
    assert -1.0 <= out['stag_loss'] <= 1.0
    assert out['prediction'] == ['Logits', [16, 3]]
    assert out['changed'] == ['1.bias', '1.weight']  # the LayerNorm affine
    assert out['num_updates'] == 1
    stats = out['stats']
    assert {'loss', 'loss_base', 'loss_stag', 'beta'} <= set(stats)
    assert stats['beta'] == 5.0
    assert abs(stats['loss'] - (stats['loss_base'] + 5.0 *
                                stats['loss_stag'])) < 1e-5
