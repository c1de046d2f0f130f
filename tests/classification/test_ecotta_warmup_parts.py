"""The parts of EcoTTA's warm-up: the learning-rate schedule against the
community code's schedulers, the augmentation, and the training-set
readers on tiny files of CIFAR's python layout (and a refused pickle)."""
import os
import pickle

import numpy as np
import pytest
import torch
from reference.ecotta_reference import reference_warmup_lr

from mmseg_stag.classification.ecotta_warmup import (augment,
                                                     read_training_set,
                                                     warmup_device, warmup_lr)


def test_learning_rate_is_warm_up_then_multistep():
    """Our closed form = the transcription's ``WarmUpLR`` then
    ``MultiStepLR.step(epoch)``; and = torch's own schedulers driven as the
    community ``main.py`` drives them."""
    iters, base = 7, 0.05
    for epoch in range(1, 11):
        for b in range(iters):
            assert warmup_lr(base, epoch, b, iters) == pytest.approx(
                reference_warmup_lr(base, epoch, b, iters), rel=1e-12)
    # torch's schedulers driven as the community main.py drives them:
    # MultiStepLR, then WarmUpLR (= this LambdaLR) stepped after each batch
    # of epoch 1, MultiStepLR.step(epoch) at the start of the later ones
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=base, momentum=0.9)
    multi = torch.optim.lr_scheduler.MultiStepLR(opt, [3, 6, 8], 0.2)
    warm = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda step: step / (iters + 1e-8))
    seen = []
    for epoch in range(1, 11):
        if epoch > 1:
            multi.step(epoch)
        for b in range(iters):
            seen.append(opt.param_groups[0]['lr'])
            if epoch == 1:
                warm.step()
    ours = [warmup_lr(base, e, b, iters) for e in range(1, 11)
            for b in range(iters)]
    assert ours == pytest.approx(seen, rel=1e-9)
    assert ours[0] == 0 and ours[iters] == base  # epoch 2 at the base lr
    assert ours[-1] == pytest.approx(base * 0.2**3)


def test_augmentation_is_seeded_and_keeps_the_range():
    x = torch.rand(16, 3, 8, 8)
    a = augment(x, torch.Generator().manual_seed(0))
    b = augment(x, torch.Generator().manual_seed(0))
    assert torch.equal(a, b) and a.shape == x.shape
    assert float(a.min()) >= 0 and float(a.max()) <= 1
    changed = [not torch.equal(a[i], x[i]) for i in range(16)]
    assert any(changed) and not all(changed)  # applied with probabilities


def test_the_warmup_device_by_default_and_refused():
    """By default the warm-up runs where MMEngine's runner (tools/test.py)
    puts the model; a device that is not one, or not on this machine, is
    refused with its name."""
    from mmengine.device import get_device
    assert warmup_device() == torch.device(get_device())
    assert warmup_device('cpu') == torch.device('cpu')
    with pytest.raises(ValueError, match="device='gpu' is not a device"):
        warmup_device('gpu')


def test_a_cuda_index_past_the_last_gpu_is_refused(monkeypatch):
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: True)
    monkeypatch.setattr(torch.cuda, 'device_count', lambda: 1)
    with pytest.raises(ValueError, match="device='cuda:3', but torch sees "
                       '1 CUDA device'):
        warmup_device('cuda:3')


def _pickle(path, obj):
    with open(path, 'wb') as f:
        pickle.dump(obj, f)


def test_cifar_python_layouts_and_npy(tmp_path):
    rng = np.random.default_rng(0)
    c10 = tmp_path / 'cifar-10-batches-py'
    os.makedirs(c10)
    data = [rng.integers(0, 256, (4, 3072), dtype=np.uint8)
            for _ in range(5)]
    for i in range(5):
        _pickle(c10 / f'data_batch_{i + 1}', {
            b'data': data[i], b'labels': list(range(i, i + 4))})
    images, labels = read_training_set(str(tmp_path))
    assert images.shape == (20, 32, 32, 3) and images.dtype == np.uint8
    # a CIFAR row is three 32x32 planes (R, G, B): B of pixel (0, 1)
    assert images[0, 0, 1, 2] == data[0][0, 2 * 1024 + 0 * 32 + 1]
    assert labels.tolist() == [j for i in range(5) for j in range(i, i + 4)]
    c100 = tmp_path / 'other' / 'cifar-100-python'
    os.makedirs(c100)
    _pickle(c100 / 'train', {b'data': data[0], b'fine_labels': [5, 6, 7, 8],
                             b'coarse_labels': [0, 0, 1, 1]})
    _pickle(c100 / 'meta', {b'fine_label_names': []})
    images, labels = read_training_set(str(c100))
    assert labels.tolist() == [5, 6, 7, 8]
    np.save(tmp_path / 'x.npy', images)
    np.save(tmp_path / 'y.npy', labels)
    x, y = read_training_set(str(tmp_path / 'x.npy'),
                             str(tmp_path / 'y.npy'))
    assert np.array_equal(x, images) and np.array_equal(y, labels)
    assert read_training_set(str(tmp_path / 'other'))[1].tolist() == \
        [5, 6, 7, 8]  # the parent folder finds it too
    os.makedirs(tmp_path / 'empty')
    with pytest.raises(FileNotFoundError, match='no training set'):
        read_training_set(str(tmp_path / 'empty'))
    with pytest.raises(ValueError, match='--train-labels'):
        read_training_set(str(tmp_path / 'x.npy'))


class _Evil:
    def __reduce__(self):
        return (os.system, ('echo pwned',))


def test_a_batch_file_with_other_objects_is_refused(tmp_path):
    c10 = tmp_path / 'cifar-10-batches-py'
    os.makedirs(c10)
    for i in range(5):
        _pickle(c10 / f'data_batch_{i + 1}', {b'data': _Evil(),
                                              b'labels': [0]})
    with pytest.raises(pickle.UnpicklingError, match='not allowed'):
        read_training_set(str(c10))
