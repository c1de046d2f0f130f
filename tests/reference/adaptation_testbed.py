"""The test bed shared by the method tests (not a transcription): tiny
float64 networks, seeded batches, the head probes that run them, one
``adapt`` call as a caller makes it, and comparisons of parameters.

Two per-sample networks:

* :func:`make_mlp` (EATA, SAR): ``Linear -> LayerNorm/BatchNorm1d -> ReLU ->
  Linear``; the classifier (module ``'3'``) is confident enough for the
  ``0.4 ln C`` entropy filter; inputs from :func:`vectors`.
* :func:`make_cnn` (DeYO, CoTTA): ``Conv -> BatchNorm2d -> ReLU -> 2x2
  average pooling -> Flatten -> Linear`` (classifier ``'5'``); images from
  :func:`block_images` (constant blocks of DeYO's 4x4 patch grid) or
  :func:`unit_images` (uniform in ``[0, 1]``, CoTTA's augmentations).

One per-pixel network and the authors' view of it (EATA, SAR and DeYO on
segmentation outputs, every pixel a sample):

* :func:`make_seg_net`: ``Conv 3x3 -> GroupNorm/BatchNorm2d -> ReLU -> 1x1
  Conv`` (classifier ``'3'``, read by :data:`SEG_PROBE`), logits at the
  input resolution; images from :func:`seg_images` or :func:`block_images`.
* :class:`PixelsAsSamples` around it, fed by :func:`pixels_as_samples`: a
  per-sample model whose samples are the pixels (``[N*H*W, C]`` logits,
  pixel ``(n, i, j)`` at row ``n*H*W + i*W + j``), on which the authors'
  per-sample code runs unchanged.
"""
import copy
import math

import torch
import torch.nn as nn

from mmseg_stag.core import Batch, ForwardPass, HeadProbe, TaskAdapter

C = 5  # classes of both networks
E0 = 0.4 * math.log(C)  # the 0.4 ln C entropy margin of EATA and SAR
LR = 0.05  # large, so that a wrong update is visible
OPT = dict(type='SGD', lr=LR, momentum=0.9)

MLP_PROBE = HeadProbe('3')  # classifier of make_mlp
CNN_PROBE = HeadProbe('5')  # classifier of make_cnn
# classifier of make_seg_net
SEG_PROBE = HeadProbe('3', prediction_kind='per_pixel')
# what a method is configured with: the task's operations through a probe
MLP_ADAPTER = TaskAdapter(MLP_PROBE)
CNN_ADAPTER = TaskAdapter(CNN_PROBE)
SEG_ADAPTER = TaskAdapter(SEG_PROBE)


def make_mlp(seed=2, norm='ln'):
    """``Linear(6, 8) -> LayerNorm(8) (or BatchNorm1d) -> ReLU ->
    Linear(8, C)`` in float64, evaluation mode, confident classifier."""
    torch.manual_seed(seed)
    norm_layer = nn.LayerNorm(8) if norm == 'ln' else nn.BatchNorm1d(8)
    model = nn.Sequential(nn.Linear(6, 8), norm_layer, nn.ReLU(),
                          nn.Linear(8, C))
    with torch.no_grad():
        model[3].weight.mul_(6.0)  # confident enough for E0 = 0.4 ln C
        model[1].weight.uniform_(0.5, 1.5)
        model[1].bias.uniform_(-0.3, 0.3)
    return model.double().eval()


def vectors(seed, n=16):
    """A seeded batch ``[n, 6]`` for :func:`make_mlp`."""
    return torch.randn(n, 6, dtype=torch.float64,
                       generator=torch.Generator().manual_seed(seed))


def make_cnn(seed=1, scale=20.0):
    """Conv-BN-ReLU, 2x2 average pooling (so that shuffling patches changes
    the prediction), linear classifier (module ``'5'``), float64, eval.

    The first conv is scaled by ``scale`` (20 for DeYO: confident enough
    for ``0.5 ln C`` while the classifier keeps moderate weights, a very
    peaked ``W W^T`` making STAG's anchors vanish; 10 for CoTTA)."""
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4),
                          nn.ReLU(), nn.AdaptiveAvgPool2d(2), nn.Flatten(),
                          nn.Linear(16, C))
    with torch.no_grad():
        model[0].weight.mul_(scale)
        model[0].bias.mul_(scale)
    return model.double().eval()


def block_images(seed, n=16, size=16):
    """Images made of constant blocks of a 4x4 grid (the patches of DeYO's
    shuffle), so that shuffling often changes the prediction."""
    cells = torch.randn(n, 3, 4, 4, dtype=torch.float64,
                        generator=torch.Generator().manual_seed(seed))
    return cells.repeat_interleave(size // 4, -1).repeat_interleave(
        size // 4, -2)


def unit_images(seed, n=8, size=16):
    """Images in ``[0, 1]``."""
    return torch.rand(n, 3, size, size, dtype=torch.float64,
                      generator=torch.Generator().manual_seed(seed))


def make_seg_net(seed=5, norm='gn', scale=6.0):
    """``Conv2d(3, 8, 3, padding=1) -> GroupNorm(2, 8) (or BatchNorm2d(8))
    -> ReLU -> Conv2d(8, C, 1)`` in float64, evaluation mode: per-pixel
    logits at the input resolution. The norm layer is ``[1]`` and the
    classifier ``[3]``, as in :func:`make_mlp` (so :func:`norm_params` and
    :func:`sgd_on_norm_params` serve both); the classifier is scaled by
    ``scale``, confident enough for the ``0.4 ln C`` filters."""
    torch.manual_seed(seed)
    norm_layer = nn.GroupNorm(2, 8) if norm == 'gn' else nn.BatchNorm2d(8)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), norm_layer,
                          nn.ReLU(), nn.Conv2d(8, C, 1))
    with torch.no_grad():
        model[3].weight.mul_(scale)
        model[1].weight.uniform_(0.5, 1.5)
        model[1].bias.uniform_(-0.3, 0.3)
    return model.double().eval()


def seg_images(seed, n=2, size=8):
    """Seeded images ``[n, 3, size, size]`` for :func:`make_seg_net`."""
    return torch.randn(n, 3, size, size, dtype=torch.float64,
                       generator=torch.Generator().manual_seed(seed))


class PixelsAsSamples(nn.Module):
    """A per-pixel network ``net`` (:func:`make_seg_net`) seen as a
    per-sample model whose samples are pixels: sample ``k`` of an input
    from :func:`pixels_as_samples` is its image plus a constant channel
    holding the pixel's location ``i*W + j``; the output is that pixel's
    logits, ``[M, C]``. (A constant channel is unchanged by DeYO's patch
    shuffle: a shuffled sample keeps its location.)"""

    def __init__(self, net):
        super().__init__()
        self.net = net

    def pixel_outputs(self, samples):
        """``(features [M, D], logits [M, C])`` of the samples' pixels."""
        images, where = samples[:, :-1], samples[:, -1, 0, 0].long()
        feats = self.net[:3](images)
        logits = self.net[3](feats)
        rows = torch.arange(samples.shape[0])
        return (feats.flatten(2)[rows, :, where],
                logits.flatten(2)[rows, :, where])

    def forward(self, samples):
        return self.pixel_outputs(samples)[1]


def pixels_as_samples(images):
    """The input of :class:`PixelsAsSamples` for ``images [N, c, H, W]``:
    ``[N*H*W, c + 1, H, W]``, sample ``n*H*W + i*W + j`` = image ``n`` and
    a channel filled with ``i*W + j``."""
    n, _, h, w = images.shape
    where = torch.arange(h * w, dtype=images.dtype).repeat(n)
    return torch.cat([images.repeat_interleave(h * w, 0),
                      where.view(-1, 1, 1, 1).expand(-1, 1, h, w)], 1)


def pixel_forward(model, samples):
    """``forward(model, x) -> (logits, [(features, logits)])`` of a
    :class:`PixelsAsSamples` (the reference SAR's forward)."""
    feats, logits = model.pixel_outputs(samples)
    return logits, [(feats, logits)]


def pixel_rows(maps):
    """``[N, C, H, W] -> [N*H*W, C]``, row ``n*H*W + i*W + j`` = pixel
    ``(n, i, j)`` (by indexing, not by ``flatten_outputs``)."""
    n, _, h, w = maps.shape
    return torch.stack([maps[k, :, i, j] for k in range(n)
                        for i in range(h) for j in range(w)])


class ScriptedAdapter(TaskAdapter):
    """A task adapter whose forward pass is ``forward(model, inputs) ->
    (logits, head_outputs)``, for tests that script or record it."""

    def __init__(self, forward, probe):
        super().__init__(probe)
        self.script = forward

    def forward(self, model, batch, inputs=None):
        logits, head_outputs = self.script(
            model, batch.inputs if inputs is None else inputs)
        return ForwardPass(logits, head_outputs)


def adapt(method, inputs, forward=None):
    """One batch as the caller runs it: gradients enabled iff the method
    updates; returns ``(prediction, stats)``, the prediction's tensor and
    the stats read as floats.
    ``forward``: this batch's forward passes go through it instead."""
    adapter = method.task_adapter
    if forward is not None:
        method.task_adapter = ScriptedAdapter(forward, adapter.probe)
    try:
        with torch.set_grad_enabled(method.has_loss):
            prediction, stats = method.adapt(Batch(inputs))
    finally:
        method.task_adapter = adapter
    return prediction.value, floats(stats)


def floats(stats):
    """A method's statistics (floats or 0-d tensors) as floats."""
    return {k: float(v) for k, v in stats.items()}


def norm_params(model):
    """The affine parameters of the normalisation layer ``model[1]``."""
    return [model[1].weight, model[1].bias]


def sgd_on_norm_params(model, lr=LR, momentum=0.9):
    """The authors' setup: a copy of ``model`` with only the norm affine
    parameters trainable, and ``torch.optim.SGD`` on them."""
    ref = copy.deepcopy(model)
    ref.requires_grad_(False)
    for p in norm_params(ref):
        p.requires_grad_(True)
    return ref, torch.optim.SGD(norm_params(ref), lr, momentum=momentum)


def assert_params_equal(a, b, tol=1e-12):
    """Same parameter names, in order, and values within ``tol``."""
    pa, pb = list(a.named_parameters()), list(b.named_parameters())
    assert len(pa) == len(pb)
    for (na, ta), (nb, tb) in zip(pa, pb):
        assert na == nb
        torch.testing.assert_close(ta, tb, rtol=tol, atol=tol, msg=na)


def assert_lists_close(a, b, tol=1e-12):
    for x, y in zip(a, b, strict=True):
        torch.testing.assert_close(x, y, rtol=tol, atol=tol)


def assert_state_unchanged(model, before):
    """``model.state_dict()`` equals the ``before`` copy exactly."""
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), k
