"""``TTAEncoderDecoder``: head features and logits from one forward pass,
MMSeg-identical predictions, and the hand-off to a TTA adapter."""
import copy

import pytest
import torch
import torch.nn as nn
from mmengine.config import ConfigDict
from mmengine.registry import init_default_scope
from mmseg.models.decode_heads import SegformerHead
from mmseg.models.segmentors import EncoderDecoder
from mmseg.registry import MODELS
from mmseg.structures import SegDataSample

import mmseg_stag  # noqa: F401  (registers the components)
from mmseg_stag.models import NVSegformerHead, TTAEncoderDecoder

NUM_CLASSES = 5
BN = dict(type='BN', requires_grad=True)
# MiT stage widths are embed_dims * num_heads[i]: [8, 16, 16, 16]
TINY_MIT = dict(
    type='MixVisionTransformer',
    in_channels=3,
    embed_dims=8,
    num_stages=4,
    num_layers=[1, 1, 1, 1],
    num_heads=[1, 2, 2, 2],
    patch_sizes=[7, 3, 3, 3],
    sr_ratios=[8, 4, 2, 1],
    out_indices=(0, 1, 2, 3),
    mlp_ratio=4,
    qkv_bias=True,
    drop_rate=0.0,
    attn_drop_rate=0.0,
    drop_path_rate=0.0,
    init_cfg=None)
IN_CHANNELS = [8, 16, 16, 16]
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


def model_cfg(head='mmseg', test_cfg=WHOLE, seg_type='TTAEncoderDecoder',
              **kwargs):
    cfg = dict(
        type=seg_type,
        backbone=copy.deepcopy(TINY_MIT),
        decode_head=copy.deepcopy(HEADS[head]),
        train_cfg=dict(),
        test_cfg=dict(test_cfg))
    cfg.update(kwargs)
    return ConfigDict(cfg)  # as built from a config file


def build(head='mmseg', test_cfg=WHOLE, seed=0, **kwargs):
    """A tiny segmentor in eval mode with non-trivial BN statistics."""
    init_default_scope('mmseg')
    torch.manual_seed(seed)
    model = MODELS.build(model_cfg(head, test_cfg, **kwargs))
    for module in model.modules():
        if isinstance(module, nn.BatchNorm2d):
            module.running_mean.uniform_(-0.3, 0.3)
            module.running_var.uniform_(0.5, 1.5)
    return model.eval()


def plain_copy(model, head, test_cfg):
    """MMSeg's own EncoderDecoder with the same weights."""
    init_default_scope('mmseg')
    plain = MODELS.build(model_cfg(head, test_cfg, seg_type='EncoderDecoder'))
    assert type(plain) is EncoderDecoder
    plain.load_state_dict(model.state_dict(), strict=True)
    return plain.eval()


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
    with torch.enable_grad():
        seg_logits, outs = model.inference_with_features(inputs, metas(2))
    expected = 1 if mode == 'whole' else N_CROPS
    assert len(outs) == expected
    assert len(head_calls) == expected and len(backbone_calls) == expected
    assert seg_logits.shape == (2, NUM_CLASSES, *INPUT_HW)
    size = head_resolution(INPUT_HW if mode == 'whole' else (32, 32))
    classifier = model.classifier
    assert classifier is model.decode_head.conv_seg
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


def test_no_graph_without_grad():
    model = build('nvlabs')
    with torch.no_grad():
        seg_logits, ((feats, logits), ) = model.inference_with_features(
            torch.randn(1, 3, *INPUT_HW), metas())
    assert not feats.requires_grad and not logits.requires_grad
    assert not seg_logits.requires_grad


def test_custom_classifier_name_and_classifier_property():
    model = build('mmseg', classifier_name='decode_head.conv_seg')
    assert model.classifier_name == 'decode_head.conv_seg'
    assert model.classifier.weight.shape == (NUM_CLASSES, 16, 1, 1)
    assert model.classifier.bias.shape == (NUM_CLASSES, )
    assert model.tta_adapter is None


# -------------------------------------------------------------- validation
@MODELS.register_module(name='TestHead3x3Classifier', force=True)
class Head3x3Classifier(SegformerHead):
    """A SegformerHead whose classifier is a 3x3 conv (for the tests)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.conv_seg = nn.Conv2d(self.channels, self.num_classes, 3,
                                  padding=1)


@pytest.mark.parametrize('name, found', [
    ('decode_head.no_such_conv', 'does not name a module'),
    ('decode_head.linear_c1.proj', 'is a Linear'),
    ('backbone.layers.0.0.projection', 'kernel_size=(7, 7)'),
    ('backbone.layers.0.1.0.ffn.layers.1', 'groups=32'),
])
def test_bad_classifier_name(name, found):
    with pytest.raises(ValueError) as err:
        build('nvlabs', classifier_name=name)
    message = str(err.value)
    assert name in message and found in message
    assert 'head without a 1x1 classifier' in message


def test_head_without_1x1_classifier():
    init_default_scope('mmseg')
    cfg = model_cfg('mmseg')
    cfg['decode_head']['type'] = 'TestHead3x3Classifier'
    with pytest.raises(ValueError, match=r"'decode_head.conv_seg'.*"
                       r'kernel_size=\(3, 3\).*head without a 1x1 '
                       'classifier'):
        MODELS.build(cfg)


def test_classifier_off_the_inference_path():
    aux = dict(type='FCNHead', in_channels=16, in_index=1, channels=8,
               num_convs=1, num_classes=NUM_CLASSES, norm_cfg=BN)
    model = build('mmseg', auxiliary_head=aux,
                  classifier_name='auxiliary_head.conv_seg')
    with pytest.raises(RuntimeError, match='auxiliary_head.conv_seg.*did '
                       'not run'):
        model.inference_with_features(torch.randn(1, 3, *INPUT_HW), metas())
    assert not model.classifier._forward_hooks


# ------------------------------------------------------------- predictions
@pytest.mark.parametrize('head', ['mmseg', 'nvlabs'])
@pytest.mark.parametrize('mode', ['whole', 'slide'])
def test_predict_equals_encoder_decoder(head, mode):
    test_cfg = WHOLE if mode == 'whole' else SLIDE
    model = build(head, test_cfg)
    plain = plain_copy(model, head, test_cfg)
    torch.manual_seed(2)
    inputs = torch.randn(2, 3, *INPUT_HW)
    with torch.no_grad():
        ours = model.predict(inputs, data_samples(2))
        theirs = plain.predict(inputs, data_samples(2))
        ours_bare = model.predict(inputs)
        theirs_bare = plain.predict(inputs)
    for a, b in zip(ours + ours_bare, theirs + theirs_bare):
        torch.testing.assert_close(a.seg_logits.data, b.seg_logits.data)
        assert torch.equal(a.pred_sem_seg.data, b.pred_sem_seg.data)
    # padding removed, resized to ori_shape
    assert ours[0].pred_sem_seg.shape == (57, 90)
    assert ours_bare[0].pred_sem_seg.shape == INPUT_HW


# ---------------------------------------------------------------- adapter
class FakeAdapter:
    """Predict-then-adapt with one forward: entropy of the head logits,
    one SGD step on the classifier, return the pre-step ``seg_logits``."""

    def __init__(self, model, lr=1.0):
        self.calls = []
        self.optimizer = torch.optim.SGD(model.classifier.parameters(), lr=lr)

    def adapt_and_predict(self, model, inputs, batch_img_metas):
        self.calls.append((model, inputs, batch_img_metas))
        with torch.enable_grad():
            seg_logits, head_outputs = model.inference_with_features(
                inputs, batch_img_metas)
            loss = 0
            for _, logits in head_outputs:
                p = logits.softmax(1)
                loss = loss - (p * logits.log_softmax(1)).sum(1).mean()
            self.optimizer.zero_grad()
            loss.backward()
            self.optimizer.step()
        return seg_logits.detach()


@pytest.mark.parametrize('mode', ['whole', 'slide'])
def test_predict_hands_off_to_the_adapter(mode, monkeypatch):
    test_cfg = WHOLE if mode == 'whole' else SLIDE
    model = build('nvlabs', test_cfg)
    before = plain_copy(model, 'nvlabs', test_cfg)  # frozen copy
    weight0 = model.classifier.weight.detach().clone()
    adapter = FakeAdapter(model)
    model.tta_adapter = adapter
    head_calls = count_calls(monkeypatch, model.decode_head)
    torch.manual_seed(3)
    inputs = torch.randn(1, 3, *INPUT_HW)
    samples = data_samples(1)
    with torch.no_grad():  # as in MMEngine's TestLoop
        results = model.predict(inputs, samples)
    # one call, with the model, the batch and the samples' metainfo
    assert len(adapter.calls) == 1
    called_model, called_inputs, called_metas = adapter.calls[0]
    assert called_model is model and called_inputs is inputs
    assert called_metas[0]['ori_shape'] == (57, 90)
    # one forward only (the adapter's): predict-then-adapt
    assert len(head_calls) == (1 if mode == 'whole' else N_CROPS)
    # the classifier was updated ...
    assert not torch.equal(model.classifier.weight.detach(), weight0)
    # ... but the prediction is the one of the model before the update,
    # post-processed as MMSeg does (padding removed, ori_shape)
    with torch.no_grad():
        expected = before.predict(inputs, data_samples(1))
    assert results[0].pred_sem_seg.shape == (57, 90)
    torch.testing.assert_close(results[0].seg_logits.data,
                               expected[0].seg_logits.data)
    assert torch.equal(results[0].pred_sem_seg.data,
                       expected[0].pred_sem_seg.data)
    # the next batch sees the adapted model
    with torch.no_grad():
        second = model.predict(inputs, data_samples(1))
    assert not torch.allclose(second[0].seg_logits.data,
                              expected[0].seg_logits.data)
    # no samples: MMSeg's default metas are handed over
    with torch.no_grad():
        model.predict(inputs)
    assert adapter.calls[-1][2][0]['ori_shape'] == INPUT_HW
    # detaching the adapter restores MMSeg's predict
    model.tta_adapter = None
    plain = plain_copy(model, 'nvlabs', test_cfg)
    with torch.no_grad():
        a = model.predict(inputs, data_samples(1))
        b = plain.predict(inputs, data_samples(1))
    assert len(adapter.calls) == 3
    torch.testing.assert_close(a[0].seg_logits.data, b[0].seg_logits.data)
    # the adapter never enters the state dict
    assert set(model.state_dict()) == set(plain.state_dict())


def test_registered_types():
    init_default_scope('mmseg')
    assert MODELS.get('TTAEncoderDecoder') is TTAEncoderDecoder
    assert MODELS.get('NVSegformerHead') is NVSegformerHead
    assert issubclass(TTAEncoderDecoder, EncoderDecoder)
