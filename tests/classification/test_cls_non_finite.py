"""A non-finite step stops the classification stream as it stops the
segmentation one (tests/engine/test_non_finite.py): a nan put into a
method's loss at batch k stops the run naming the method, the statistic,
batch k and its corruption, with the finished stages written and nothing
of batch k's stage; on the mild stream (every corruption from the source,
a method built anew per stage) and the continual one."""
import os.path as osp

import pytest
import torch
from cls_helpers import CIFAR, IMAGENET, options, run

from mmseg_stag.core.methods.base import BaseMethod
from mmseg_stag.engine import OnlineAdaptationLoop
from mmseg_stag.engine.run_state import STATE_FILE

#: 40 images a corruption, 8 a batch: stage 1 is batches 5 to 9
K = 7


def poison_batch(monkeypatch, k):
    """Every method's base loss, as ``add_stag`` (which each calls)
    receives it, is nan at batch ``k``: patched on the classes, as a
    restart from the source builds the method anew."""
    at = {'batch': None}
    run_iter, add_stag = OnlineAdaptationLoop.run_iter, BaseMethod.add_stag

    def counted(self, idx, data_batch):
        at['batch'] = idx
        return run_iter(self, idx, data_batch)

    def poisoned(self, base, fwd, beta=None):
        if at['batch'] == k and base is not None:
            base = base + float('nan')
        return add_stag(self, base, fwd, beta)

    monkeypatch.setattr(OnlineAdaptationLoop, 'run_iter', counted)
    monkeypatch.setattr(BaseMethod, 'add_stag', poisoned)


# margins wide enough that every sample passes the filters: the loss the
# nan goes into is computed at batch k
@pytest.mark.parametrize('config,extra', [
    (CIFAR.format('tent'), {}),
    (CIFAR.format('cotta-stag'), {'test_cfg.method.num_augs': 2}),
    (IMAGENET.format('eata'), {'test_cfg.method.fisher_alpha': 0,
                               'test_cfg.source_dataloader': None,
                               'test_cfg.method.entropy_margin': 10.0,
                               'test_cfg.method.d_margin': 1.1}),
    (IMAGENET.format('sar'), {'test_cfg.method.entropy_margin': 10.0}),
    (IMAGENET.format('deyo-stag'), {'test_cfg.method.deyo_margin': 10.0,
                                    'test_cfg.method.plpd_threshold': -1.0}),
])
def test_nan_loss_stops_the_classification_stream(
        config, extra, tmp_path, stream, names, checkpoint, monkeypatch):
    _, root = stream
    opts = options(root, names, batch_size=8, **{
        'default_hooks.logger.interval': 50}, **extra)
    poison_batch(monkeypatch, K)
    with pytest.raises(ValueError, match=f'is nan at batch {K} \\(image '
                       f'{names[1]}, {names[1]}'):
        run(config, checkpoint, tmp_path, opts)
    with open(osp.join(tmp_path, 'continual_results.partial.jsonl')) as f:
        assert len(f.readlines()) == 1
    state = torch.load(osp.join(tmp_path, STATE_FILE), weights_only=True)
    assert state['batches_done'] == 5
    for value in state['method']['model'].values():
        assert torch.isfinite(value.float()).all()
    assert not osp.exists(osp.join(tmp_path, 'continual_results.json'))
