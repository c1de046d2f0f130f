"""``HeadProbe`` on MMSeg's plain ``EncoderDecoder`` (what
``OnlineAdaptationLoop`` runs around ``model.inference``): head features and
logits from one forward pass, whole and slide inference, MMSeg and NVlabs
heads, classifier checks, and predictions identical to
``EncoderDecoder.predict``."""
import pytest
import torch
import torch.nn as nn
from mmseg.models.decode_heads import SegformerHead
from mmseg.models.segmentors import EncoderDecoder
from mmseg.registry import MODELS
from mmseg.structures import SegDataSample
from seg_helpers import (NVLABS_SEG_CFG, SEG_CFG, build_from_config,
                         build_segmentor, tiny_options)

import mmseg_stag  # noqa: F401  (registers the components)
from mmseg_stag.core import HeadProbe

NUM_CLASSES = 5
BN = dict(type='BN', requires_grad=True)
IN_CHANNELS = [8, 16, 16, 16]  # the tiny MiT's stage widths
HEADS = {
    'mmseg': dict(
        type='SegformerHead',
        in_channels=IN_CHANNELS,
        in_index=[0, 1, 2, 3],
        channels=16,
        dropout_ratio=0.1,
        num_classes=NUM_CLASSES,
        norm_cfg=BN,
        align_corners=False),
    'nvlabs': dict(
        type='NVSegformerHead',
        embedding_dim=12,
        in_channels=IN_CHANNELS,
        in_index=[0, 1, 2, 3],
        dropout_ratio=0.1,
        num_classes=NUM_CLASSES,
        norm_cfg=BN,
        align_corners=False),
    'fcn': dict(
        type='FCNHead',
        in_channels=8,
        in_index=0,
        channels=8,
        num_convs=1,
        concat_input=False,
        dropout_ratio=0.1,
        num_classes=NUM_CLASSES,
        norm_cfg=BN,
        align_corners=False),
}
WHOLE = dict(mode='whole')
# input 40x64, crops 32x32, stride 24: 2 rows x 3 columns of crops
SLIDE = dict(mode='slide', crop_size=(32, 32), stride=(24, 24))
INPUT_HW = (40, 64)
N_CROPS = 6
CLASSIFIER = 'decode_head.conv_seg'


def build(head='mmseg', test_cfg=WHOLE, seed=0, **kwargs):
    """A tiny EncoderDecoder in eval mode with non-trivial BN statistics."""
    model = build_segmentor(HEADS[head], test_cfg, seed=seed, **kwargs)
    assert type(model) is EncoderDecoder
    for module in model.modules():
        if isinstance(module, nn.BatchNorm2d):
            module.running_mean.uniform_(-0.3, 0.3)
            module.running_var.uniform_(0.5, 1.5)
    return model


def metas(n=1, hw=INPUT_HW):
    return [
        dict(ori_shape=hw, img_shape=hw, pad_shape=hw,
             padding_size=[0, 0, 0, 0]) for _ in range(n)
    ]


def data_samples(n=1):
    """Samples whose image was padded (right 4, bottom 2) after a resize
    from a larger original."""
    samples = []
    for _ in range(n):
        s = SegDataSample()
        s.set_metainfo(dict(
            ori_shape=(57, 90), img_shape=(38, 60), pad_shape=INPUT_HW,
            padding_size=[0, 4, 0, 2], scale_factor=(0.667, 0.667)))
        samples.append(s)
    return samples


class inference_probe(HeadProbe):  # noqa: N801 (used as a function)
    """The loop's forward: the probe around ``model.inference``, as
    ``SegmentationAdapter.forward`` runs it."""

    def __init__(self, batch_img_metas, head_layer=CLASSIFIER):
        super().__init__(head_layer, 'per_pixel')
        self.metas = batch_img_metas

    def __call__(self, model, inputs):
        return super().__call__(
            model, inputs, run=lambda x: model.inference(x, self.metas))


def count_calls(monkeypatch, module):
    """Count calls of ``module.forward`` (BaseDecodeHead.predict calls
    ``self.forward`` directly, so module hooks would not see them)."""
    calls = []
    original = module.forward

    def counted(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(module, 'forward', counted)
    return calls


def head_resolution(hw):
    # MiT's first patch embedding: kernel 7, stride 4, padding 3
    return tuple((x + 2 * 3 - 7) // 4 + 1 for x in hw)


# ------------------------------------------------------------ head outputs
@pytest.mark.parametrize('head', ['mmseg', 'nvlabs', 'fcn'])
@pytest.mark.parametrize('mode', ['whole', 'slide'])
def test_head_outputs_from_one_forward(head, mode, monkeypatch):
    test_cfg = WHOLE if mode == 'whole' else SLIDE
    model = build(head, test_cfg)
    head_calls = count_calls(monkeypatch, model.decode_head)
    backbone_calls = count_calls(monkeypatch, model.backbone)
    torch.manual_seed(1)
    inputs = torch.randn(2, 3, *INPUT_HW)
    probe = inference_probe(metas(2))
    with torch.enable_grad():
        seg_logits, outs = probe(model, inputs)
    expected = 1 if mode == 'whole' else N_CROPS
    assert len(outs) == expected
    assert len(head_calls) == expected and len(backbone_calls) == expected
    assert seg_logits.shape == (2, NUM_CLASSES, *INPUT_HW)
    size = head_resolution(INPUT_HW if mode == 'whole' else (32, 32))
    classifier = probe.classifier(model)
    assert classifier is model.decode_head.conv_seg
    assert probe.find(model) == (CLASSIFIER, classifier)
    for feats, logits in outs:
        assert feats.shape == (2, classifier.in_channels, *size)
        assert logits.shape == (2, NUM_CLASSES, *size)
        # the recorded features are exactly the classifier's input
        torch.testing.assert_close(classifier(feats), logits)
        assert feats.requires_grad and logits.requires_grad
    # the hook lives only during the call
    assert not classifier._forward_hooks
    # same seg_logits as MMSeg's own inference on the same model
    with torch.no_grad():
        torch.testing.assert_close(seg_logits.detach(),
                                   model.inference(inputs, metas(2)))
    # the graph reaches the classifier and the backbone
    loss = sum(z.logsumexp(1).mean() + h.square().mean() for h, z in outs)
    loss.backward()
    assert classifier.weight.grad is not None
    assert classifier.weight.grad.abs().sum() > 0
    patch = model.backbone.layers[0][0].projection.weight
    assert patch.grad is not None and patch.grad.abs().sum() > 0


@pytest.mark.parametrize('config', [SEG_CFG, NVLABS_SEG_CFG])
@pytest.mark.parametrize('mode', ['whole', 'slide'])
def test_head_outputs_of_the_real_configs(config, mode, tiny_acdc):
    """The configs' own (shrunk) models, as the loop runs them."""
    head = 'nvlabs' if 'nvlabs' in config else 'mmseg'
    opts = tiny_options(tiny_acdc, head=head)
    if mode == 'slide':
        opts['model.test_cfg'] = dict(mode='slide', crop_size=(32, 32),
                                      stride=(24, 24))
    model, _ = build_from_config(config.format('tent'), opts)
    model.eval()
    assert type(model) is EncoderDecoder
    inputs = torch.randn(1, 3, 32, 64)
    batch_metas = [dict(ori_shape=(32, 64), img_shape=(32, 64),
                        pad_shape=(32, 64), padding_size=[0, 0, 0, 0])]
    calls = []
    head_forward = model.decode_head.forward
    model.decode_head.forward = lambda x: calls.append(1) or head_forward(x)
    probe = inference_probe(batch_metas)
    with torch.enable_grad():
        seg_logits, outs = probe(model, inputs)
    n_crops = 1 if mode == 'whole' else 3  # 64 wide, crops 32, stride 24
    assert len(outs) == n_crops and len(calls) == n_crops
    classifier = probe.classifier(model)
    for feats, logits in outs:
        assert feats.shape[1] == classifier.in_channels
        # the head's own resolution: 1/4 of the (crop) input
        assert feats.shape[2:] == logits.shape[2:] == (
            (8, 16) if mode == 'whole' else (8, 8))
        torch.testing.assert_close(classifier(feats), logits)
        assert logits.requires_grad
    with torch.no_grad():
        plain = model.inference(inputs, batch_metas)
    torch.testing.assert_close(seg_logits.detach(), plain)


def test_no_graph_without_grad():
    model = build('nvlabs')
    with torch.no_grad():
        seg_logits, ((feats, logits), ) = inference_probe(metas())(
            model, torch.randn(1, 3, *INPUT_HW))
    assert not feats.requires_grad and not logits.requires_grad
    assert not seg_logits.requires_grad


# ------------------------------------------------------ classifier by name
@MODELS.register_module(name='TestHeadNamedClassifier', force=True)
class HeadNamedClassifier(SegformerHead):
    """A SegformerHead whose classifier is called ``linear_pred`` (as in
    NVlabs' code) and which has no ``conv_seg``."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.linear_pred = self.conv_seg
        del self.conv_seg

    def cls_seg(self, feat):
        if self.dropout is not None:
            feat = self.dropout(feat)
        return self.linear_pred(feat)


def test_default_and_custom_classifier_name():
    model = build('mmseg')
    name, classifier = HeadProbe(CLASSIFIER, 'per_pixel').find(model)
    assert name == CLASSIFIER and classifier is model.decode_head.conv_seg
    assert classifier.weight.shape == (NUM_CLASSES, 16, 1, 1)
    assert classifier.bias.shape == (NUM_CLASSES, )
    # a head whose classifier has another name: named in the probe
    custom = build_segmentor(dict(HEADS['mmseg'],
                                  type='TestHeadNamedClassifier'))
    inputs = torch.randn(1, 3, *INPUT_HW)
    probe = inference_probe(metas(), head_layer='decode_head.linear_pred')
    with torch.no_grad():
        seg_logits, ((feats, logits), ) = probe(custom, inputs)
        torch.testing.assert_close(seg_logits,
                                   custom.inference(inputs, metas()))
        torch.testing.assert_close(custom.decode_head.linear_pred(feats),
                                   logits)
    assert probe.classifier(custom) is custom.decode_head.linear_pred
    assert feats.shape[1] == 16
    with pytest.raises(ValueError, match="no module 'decode_head.conv_seg'"):
        inference_probe(metas())(custom, inputs)


# -------------------------------------------------------------- validation
@MODELS.register_module(name='TestHead3x3Classifier', force=True)
class Head3x3Classifier(SegformerHead):
    """A SegformerHead whose classifier is a 3x3 conv (for the tests)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.conv_seg = nn.Conv2d(self.channels, self.num_classes, 3,
                                  padding=1)


@pytest.mark.parametrize('name, found', [
    ('decode_head.no_such_conv', 'has no module'),
    ('decode_head.linear_c1.proj', 'is a Linear'),
    ('backbone.layers.0.0.projection', 'kernel_size=(7, 7)'),
    ('backbone.layers.0.1.0.ffn.layers.1', 'groups=32'),
])
def test_bad_classifier_name(name, found):
    model = build('nvlabs')
    probe = HeadProbe(name, 'per_pixel')
    for check in (probe.find,
                  lambda m: probe(m, torch.randn(1, 3, *INPUT_HW))):
        with pytest.raises(ValueError) as err:
            check(model)
        message = str(err.value)
        assert name in message and found in message
        if found != 'has no module':  # a module that is no 1x1 conv
            assert 'head without a 1x1 classifier' in message


def test_head_without_1x1_classifier():
    model = build_segmentor(dict(HEADS['mmseg'],
                                 type='TestHead3x3Classifier'))
    with pytest.raises(ValueError, match=r"'decode_head.conv_seg'.*"
                       r'kernel_size=\(3, 3\).*head without a 1x1 '
                       'classifier'):
        HeadProbe(CLASSIFIER, 'per_pixel').find(model)


def test_classifier_off_the_inference_path():
    aux = dict(type='FCNHead', in_channels=16, in_index=1, channels=8,
               num_convs=1, num_classes=NUM_CLASSES, norm_cfg=BN)
    model = build('mmseg', auxiliary_head=aux)
    probe = inference_probe(metas(), head_layer='auxiliary_head.conv_seg')
    assert probe.classifier(model) is model.auxiliary_head.conv_seg
    with pytest.raises(RuntimeError, match='auxiliary_head.conv_seg.*did '
                       'not run'):
        probe(model, torch.randn(1, 3, *INPUT_HW))
    assert not model.auxiliary_head.conv_seg._forward_hooks


# ------------------------------------------------------------- predictions
@pytest.mark.parametrize('head', ['mmseg', 'nvlabs'])
@pytest.mark.parametrize('mode', ['whole', 'slide'])
def test_probed_prediction_equals_encoder_decoder_predict(head, mode):
    """The loop's path (probe around ``inference``, then
    ``postprocess_result``) gives what ``EncoderDecoder.predict`` gives."""
    model = build(head, WHOLE if mode == 'whole' else SLIDE)
    torch.manual_seed(2)
    inputs = torch.randn(2, 3, *INPUT_HW)
    samples = data_samples(2)
    default_metas = metas(2)  # what predict uses without samples
    with torch.no_grad():
        seg_logits, _ = inference_probe([s.metainfo for s in samples])(
            model, inputs)
        ours = model.postprocess_result(seg_logits, data_samples(2))
        bare_logits, _ = inference_probe(default_metas)(model, inputs)
        ours_bare = model.postprocess_result(bare_logits, None)
        theirs = model.predict(inputs, data_samples(2))
        theirs_bare = model.predict(inputs)
    for a, b in zip(ours + ours_bare, theirs + theirs_bare):
        torch.testing.assert_close(a.seg_logits.data, b.seg_logits.data)
        assert torch.equal(a.pred_sem_seg.data, b.pred_sem_seg.data)
    # padding removed, resized to ori_shape
    assert ours[0].pred_sem_seg.shape == (57, 90)
    assert ours_bare[0].pred_sem_seg.shape == INPUT_HW


def test_the_task_outputs_a_typed_prediction_post_processed_once():
    """``Logits`` are post-processed by the task, once per forward pass:
    what a loss made (``labels_at_original_size``) is kept on the forward
    pass and reused for the outputs; ``Labels`` (already at the original
    size) are set as they are."""
    from mmseg_stag.core import Labels, Logits
    from mmseg_stag.segmentation.online_task import SegmentationTask
    from mmseg_stag.segmentation.task_adapter import SegmentationBatch
    model = build()
    task = SegmentationTask(model)
    calls = []
    postprocess_result = model.postprocess_result
    model.postprocess_result = lambda *a: calls.append(1) or \
        postprocess_result(*a)
    samples = data_samples(2)
    batch = SegmentationBatch(torch.randn(2, 3, *INPUT_HW), samples,
                              [s.metainfo for s in samples])
    with torch.no_grad():
        fwd = task.task_adapter.forward(model, batch)
    labels = task.task_adapter.labels_at_original_size(batch, fwd)
    assert labels.shape == (2, 57, 90)
    torch.testing.assert_close(
        task.task_adapter.logits_at_original_size(batch, fwd).argmax(1),
        labels)
    outputs = task.outputs(batch, Logits(fwd.output.detach(),
                                         fwd.postprocessed))
    assert len(calls) == 1  # the loss's post-processing, kept on fwd
    assert torch.equal(outputs[0].pred_sem_seg.data[0], labels[0])
    # a new prediction of the same batch is post-processed anew
    task.outputs(batch, Logits(fwd.output + 1))
    assert len(calls) == 2
    given = torch.zeros(2, 57, 90, dtype=torch.long)
    outputs = task.outputs(batch, Labels(given))
    assert len(calls) == 2 and not outputs[1].pred_sem_seg.data.any()
