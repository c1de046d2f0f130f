"""What segmentation adds to the core methods: one registration per method
name, the task's own CoTTA for ``type='cotta'``; CoTTA's ACDC TENT loss at
the original size (the task's ``'original_size'`` operation) and per-pixel
CoTTA's refusal of a one-view batch, on a tiny per-pixel model; the loop's
ACDC runs of both are compared with the authors' code in
tests/segmentation/engine/test_acdc_protocol.py."""
import pytest
import torch
import torch.nn as nn

from mmseg_stag.core import (EATA, METHODS, TENT, CoTTA, ForwardPass,
                             HeadProbe, TaskAdapter, build_method)
from mmseg_stag.segmentation import (HybridTTA, SegmentationAdapter,
                                     SegmentationBatch, SegmentationCoTTA,
                                     SegmentationTask)
from mmseg_stag.segmentation.online_task import OWN_METHODS

FORWARD = HeadProbe('2', prediction_kind='per_pixel')


def make_model(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.GroupNorm(2, 8),
                         nn.Conv2d(8, 5, 1)).eval()


def images(seed=1, n=2):
    return torch.randn(n, 3, 6, 7,
                       generator=torch.Generator().manual_seed(seed))


def test_one_registration_per_name_and_the_tasks_cotta():
    """``METHODS`` holds each name once, and the segmentation task names
    its own CoTTA only: ``type='cotta'`` builds the multi-view CoTTA there,
    every other name the core's; the task's CoTTA is in no registry."""
    assert METHODS.get('tent') is TENT and METHODS.get('cotta') is CoTTA
    assert METHODS.get('hybrid_tta') is HybridTTA
    assert OWN_METHODS == dict(cotta=SegmentationCoTTA)
    assert SegmentationCoTTA not in METHODS.module_dict.values()
    task = SegmentationTask.__new__(SegmentationTask)  # no model needed
    built = {name: type(task.build_method(dict(type=name)))
             for name in ('tent', 'cotta', 'eata', 'hybrid_tta')}
    assert built == dict(tent=TENT, cotta=SegmentationCoTTA, eata=EATA,
                         hybrid_tta=HybridTTA)
    assert type(build_method(dict(type='cotta'))) is CoTTA
    assert task.build_method(dict(type='cotta', batch_views=True)).batch_views
    with pytest.raises(KeyError, match="unknown method 'tnet'.*'tent'"):
        task.build_method(dict(type='tnet'))


@pytest.mark.parametrize('option', [
    dict(num_augs=4), dict(augment=dict(hflip_prob=None)),
    dict(always_augment=True), dict(loss='symmetric_ce')])
def test_a_dead_cotta_option_raises(option):
    """Classification CoTTA's teacher augmentations and loss do nothing on
    segmentation (its teacher averages the pipeline's views, its loss is
    the cross-entropy to the label map): the task refuses them at build
    time, naming the option, instead of accepting and ignoring them."""
    task = SegmentationTask.__new__(SegmentationTask)  # no model needed
    name, = option
    with pytest.raises(TypeError, match=f'segmentation CoTTA has no '
                       f'option {name}:.*ScaleFlipViews'):
        task.build_method(dict(type='cotta', ap=0.69, **option))
    # the classification CoTTA takes it; an option neither has names itself
    assert getattr(build_method(dict(type='cotta', **option)),
                   'loss_type' if name == 'loss' else name) is not None
    with pytest.raises(TypeError, match='num_views'):
        task.build_method(dict(type='cotta', num_views=4))


def test_segmentation_cotta_keeps_the_shared_options():
    """What both CoTTAs use (the EMA, the restore, ``ap``) is still taken;
    the repr shows the segmentation options, not the classification's."""
    task = SegmentationTask.__new__(SegmentationTask)
    method = task.build_method(dict(
        type='cotta', ema_momentum=0.99, restore_prob=0.02, ap=0.69,
        restore_on_device=True, batch_views=True))
    assert (method.ema_momentum, method.restore_prob, method.ap,
            method.restore_on_device, method.batch_views) == (
                0.99, 0.02, 0.69, True, True)
    text = repr(method)
    assert 'batch_views=True' in text and 'ap=0.69' in text
    assert 'num_augs' not in text and 'augment' not in text
    with pytest.raises(ValueError, match='restore_prob'):
        task.build_method(dict(type='cotta', restore_prob=1.5))


class OriginalSizeLabels(SegmentationAdapter):
    """The segmentation adapter on a plain per-pixel model: the probe's
    forward, and given labels at the original size (the logits asked for
    are recorded)."""

    def __init__(self, labels=None):
        super().__init__(FORWARD, segmentor=None)
        self.labels, self.seen = labels, []

    def forward(self, model, batch, inputs=None, run=None):
        return ForwardPass(*FORWARD(model, batch.inputs))

    def labels_at_original_size(self, batch, fwd):
        self.seen.append(fwd.output)
        return self.labels


def test_pseudo_ce_fullres_resizes_logits_to_the_original_size_labels():
    """CoTTA's ACDC TENT: the label map comes from the task at the original
    size; the head's logits are resized bilinearly straight to it, mean CE
    over pixels (the resize by hand on constant maps: nothing changes)."""
    model = make_model()
    method = build_method(dict(type='tent', loss='pseudo_ce_fullres'))
    labels = torch.randint(0, 5, (2, 12, 14))
    adapter = OriginalSizeLabels(labels)
    method.configure(model, adapter)
    x = images()
    batch = SegmentationBatch(x)
    logits, outs = FORWARD(model, x)
    fwd = ForwardPass(logits, outs)
    up = nn.functional.interpolate(logits, size=(12, 14), mode='bilinear',
                                   align_corners=False)
    expected = -up.log_softmax(1).gather(1, labels[:, None]).mean()
    torch.testing.assert_close(method.base_loss(batch, fwd), expected)
    assert adapter.seen == [logits]
    const = logits.mean((2, 3), keepdim=True).expand_as(logits)
    torch.testing.assert_close(
        method.base_loss(batch, ForwardPass(logits, [(outs[0][0], const)])),
        nn.functional.cross_entropy(
            const[:, :, :1, :1].expand(-1, -1, 12, 14), labels))
    # a task without original-size labels: refused when configured
    with pytest.raises(ValueError, match=r"original size \(the "
                       'segmentation task'):
        method.configure(model, TaskAdapter(FORWARD))
    # a sliding window: two classifier calls
    with pytest.raises(ValueError, match="mode='whole'"):
        method.base_loss(batch, ForwardPass(logits, outs * 2))


def test_per_pixel_cotta_needs_the_views_of_a_multi_view_pipeline():
    """Segmentation CoTTA averages its teacher over the views of the batch
    (``batch.views``); a one-view batch is refused with an error that names
    the pipeline to use, another task when configured."""
    method = SegmentationCoTTA()
    model = make_model()
    with pytest.raises(ValueError, match='segmentation task'):
        method.configure(model, TaskAdapter(FORWARD))
    method.configure(model, OriginalSizeLabels())
    with pytest.raises(ValueError, match='ScaleFlipViews'):
        method.adapt(SegmentationBatch(images(n=1)))
