"""The classification harness needs neither MMSeg nor MMCV: a fresh
interpreter with both blocked imports ``mmseg_stag.classification`` and runs
one TENT+STAG row of a tiny SmallCNN over a tiny three-corruption stream."""
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

    import mmseg_stag.classification as cls

    root, names = sys.argv[1], sys.argv[2:]
    data = cls.StreamData(cls.build_corruption_sets(dict(
        type='CIFARC', data_root=root, corruptions=names, n_examples=16)))
    stages = cls.build_stream(dict(type='mild', batch_size=8), data, 0)
    spec, = cls.rows_from_config(
        dict(type='tent', optimizer=dict(type='SGD', lr=0.1)),
        dict(beta0=5.0, gamma=10.0), rows=['stag'])
    torch.manual_seed(0)
    model, classifier = cls.build_cls_model(dict(
        type='SmallCNN', num_classes=4, width=4, norm='BN'))
    result = cls.run_row(spec, model, classifier, stages, data, log=None)
    out = dict(name=result.name, num_updates=result.num_updates,
               total=result.total, classifier=classifier)
    out['imported'] = sorted(
        m for m, mod in sys.modules.items()
        if m.split('.')[0] in ('mmseg', 'mmcv') and mod is not None)
    out['segmentation'] = 'mmseg_stag.segmentation' in sys.modules
    print(json.dumps(out))
''')


def test_cls_row_runs_without_mmseg_and_mmcv(stream, names):
    _, root = stream
    proc = subprocess.run([sys.executable, '-c', SCRIPT, root, *names],
                          capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out['name'] == 'TENT+STAG' and out['classifier'] == 'fc'
    # the row finished: every image of every corruption was predicted, and
    # each batch (2 per corruption) was an update
    assert out['total'] == {c: 16 for c in names}
    assert out['num_updates'] == 6
    assert out['imported'] == [] and not out['segmentation']
