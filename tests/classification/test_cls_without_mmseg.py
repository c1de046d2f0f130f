"""A classification config runs through tools/test.py with MMSeg and MMCV
not importable: a fresh interpreter blocks both, then runs the real
CIFAR-10-C TENT+STAG config on a tiny SmallCNN and stream."""
import json
import os.path as osp
import subprocess
import sys
import textwrap

import torch

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
SCRIPT = textwrap.dedent('''
    import json
    import runpy
    import sys

    # ``import mmseg`` / ``import mmcv`` (and their submodules) now raise
    # ImportError, and importlib.util.find_spec('mmseg') returns None
    sys.modules['mmseg'] = None
    sys.modules['mmcv'] = None
    sys.argv = ['tools/test.py'] + sys.argv[1:]
    runpy.run_path('tools/test.py', run_name='__main__')
    imported = sorted(m for m, mod in sys.modules.items()
                      if m.split('.')[0] in ('mmseg', 'mmcv')
                      and mod is not None)
    print(json.dumps(dict(imported=imported, segmentation=(
        'mmseg_stag.segmentation' in sys.modules))))
''')


def test_classification_config_runs_without_mmseg_and_mmcv(
        tmp_path, stream, names, tiny_model):
    _, root = stream
    ckpt = str(tmp_path / 'tiny.pth')
    torch.save({'state_dict': tiny_model().state_dict()}, ckpt)
    config = osp.join(REPO, 'configs/cls/cifar-c/'
                      'cifar10-c_continual_wrn-28-10_tent-stag.py')
    work = tmp_path / 'work'
    proc = subprocess.run([
        sys.executable, '-c', SCRIPT, config, ckpt, '--work-dir', str(work),
        '--cfg-options', 'model.network.type=SmallCNN',
        'model.network.num_classes=4', 'model.network.width=4',
        f'test_dataloader.dataset.corruption_set.data_root={root}',
        'test_dataloader.dataset.corruption_set.n_examples=16',
        f'test_dataloader.dataset.corruptions=[{",".join(names)}]',
        'test_dataloader.batch_size=8', 'test_dataloader.num_workers=0'
    ], capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out == dict(imported=[], segmentation=False)
    with open(work / 'continual_results.json') as f:
        results = json.load(f)
    # the provenance names what ran: MMEngine, neither MMSeg nor MMCV
    prov = results['provenance']
    assert (prov['versions']['mmseg'], prov['versions']['mmcv']) == (
        None, None) and prov['versions']['mmengine']
    assert prov['config'] == osp.basename(config)
    assert prov['method']['type'] == 'tent' and prov['method']['stag']
    assert prov['images'] == 16 * len(names)
    # every image of every corruption was predicted
    per_corruption = results['details']['per_corruption']
    assert {c: v['total'] for c, v in per_corruption.items()} == {
        c: 16 for c in names}
