"""``HeadProbe``: one forward pass gives the prediction and the classifier's
inputs/outputs, for per-sample classifiers (``nn.Linear``) and per-pixel
ones (a plain 1x1 conv)."""
import copy

import pytest
import torch
import torch.nn as nn

from mmseg_stag.core import HeadProbe


class TwoHeads(nn.Module):
    """An auxiliary Linear before the classifier, and a call counter."""

    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4),
                                  nn.ReLU())
        self.proj = nn.Linear(4, 6)
        self.cls = nn.Linear(6, 3)
        self.unused = nn.Linear(6, 3)  # never called by forward
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        return self.cls(torch.relu(self.proj(self.body(x).mean((2, 3)))))


class TinySeg(nn.Module):
    """conv -> BN -> 1x1 classifier ``decode.conv_seg``; the logits are
    upsampled 2x, so the prediction is not the classifier's output."""

    def __init__(self, classifier=None):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1),
                                  nn.BatchNorm2d(4), nn.ReLU())
        self.decode = nn.Module()
        self.decode.conv_seg = classifier or nn.Conv2d(4, 5, 1)

    def forward(self, x):
        logits = self.decode.conv_seg(self.body(x))
        return nn.functional.interpolate(logits, scale_factor=2.0)


def images(n=5, size=8, seed=0):
    return torch.randn(n, 3, size, size,
                       generator=torch.Generator().manual_seed(seed))


# ------------------------------------------------------------ per sample
def test_default_is_the_last_linear_and_named_modules_are_found():
    model = TwoHeads()
    probe = HeadProbe()
    assert probe.head_layer is None and probe.prediction_kind == 'per_sample'
    # registration order: 'unused' is the last nn.Linear
    name, module = probe.find(model)
    assert name == 'unused' and module is model.unused
    probe = HeadProbe('cls')
    assert probe.find(model) == ('cls', model.cls)
    assert probe.classifier(model) is model.cls
    assert HeadProbe('proj').classifier(model) is model.proj
    # the name is looked up in whichever model is given
    other = copy.deepcopy(model)
    assert probe.classifier(other) is other.cls


def test_one_pass_gives_prediction_features_and_logits():
    model = TwoHeads().eval()
    probe = HeadProbe('cls')
    x = images()
    prediction, outs = probe(model, x)
    assert model.calls == 1
    (features, logits), = outs
    assert features.shape == (5, 6) and logits is prediction
    torch.testing.assert_close(model.cls(features), logits, rtol=0, atol=0)
    assert not model.cls._forward_hooks  # the hook is removed


def test_features_keep_their_graph():
    model = TwoHeads().eval()
    _, [(features, logits)] = HeadProbe('cls')(model, images())
    assert features.requires_grad and logits.requires_grad
    # a loss on the features reaches the BN affine parameters
    features.sum().backward()
    assert model.body[1].weight.grad is not None
    assert model.cls.weight.grad is None


def test_bad_names_and_non_classifiers_raise():
    model = TwoHeads()
    with pytest.raises(ValueError, match="no module 'head'"):
        HeadProbe('head').find(model)
    with pytest.raises(ValueError, match=r'\[C, D\]'):
        HeadProbe('body.2').find(model)  # a ReLU: no weight
    with pytest.raises(ValueError, match=r'\[C, D\]'):
        HeadProbe('body.1').find(model)  # BN: a 1-d weight
    with pytest.raises(ValueError, match=r'\[C, D\]'):
        HeadProbe('body.0').find(model)  # a 3x3 conv
    with pytest.raises(ValueError, match='no nn.Linear'):
        HeadProbe().find(nn.Sequential(nn.Conv2d(3, 3, 1)))
    # and the probe refuses to run on them, without calling the model
    with pytest.raises(ValueError, match="no module 'head'"):
        HeadProbe('head')(model, images())
    assert model.calls == 0
    for bad in ('', 3, ['cls']):
        with pytest.raises(ValueError, match='dotted module name'):
            HeadProbe(bad)
    with pytest.raises(ValueError, match='prediction_kind must be one of'):
        HeadProbe('cls', prediction_kind='per_token')


def test_classifier_not_called_raises_and_removes_the_hook():
    model = TwoHeads()
    with pytest.raises(RuntimeError, match="'unused' did not run"):
        HeadProbe()(model, images())
    assert not model.unused._forward_hooks

    def failing(x):
        model(x)
        raise KeyError('boom')

    with pytest.raises(KeyError, match='boom'):
        HeadProbe('cls')(model, images(), run=failing)
    assert not model.cls._forward_hooks


def test_per_sample_probe_rejects_conv_classifier_and_spatial_features():
    model = nn.Sequential(nn.Conv2d(3, 4, 1), nn.Conv2d(4, 2, 1))
    with pytest.raises(ValueError, match=r"'1'.*needs a \[C, D\] weight"):
        HeadProbe('1')(model, torch.randn(1, 3, 2, 2))
    # a linear layer on spatial features (no pooling) is not per sample
    model = nn.Sequential(nn.Conv2d(3, 4, 1), PermuteLast(), nn.Linear(4, 2))
    with pytest.raises(ValueError, match=r'per_sample outputs need 2-d'):
        HeadProbe('2')(model, torch.randn(1, 3, 2, 2))


class PermuteLast(nn.Module):
    """[N, D, H, W] -> [N, H, W, D], so a Linear sees 4-d features."""

    def forward(self, x):
        return x.permute(0, 2, 3, 1)


def test_run_replaces_model_call_and_each_call_is_recorded():
    model = TwoHeads().eval()
    x = images(n=4)

    def two_halves(inputs):  # e.g. sliding-window inference
        return torch.cat([model(inputs[:2]), model(inputs[2:])])

    probe = HeadProbe('cls')
    prediction, outs = probe(model, x, run=two_halves)
    assert model.calls == 2 and len(outs) == 2
    torch.testing.assert_close(prediction,
                               torch.cat([z for _, z in outs]))
    assert [f.shape[0] for f, _ in outs] == [2, 2]
    # another run on the next call, the model's own call by default
    prediction, outs = probe(model, x, run=lambda inputs: model(inputs) * 2)
    assert model.calls == 3 and len(outs) == 1
    torch.testing.assert_close(prediction, 2 * outs[0][1])
    prediction, outs = probe(model, x)
    assert model.calls == 4
    torch.testing.assert_close(prediction, outs[0][1])


# ------------------------------------------------------------- per pixel
def test_per_pixel_probe_on_a_1x1_conv():
    model = TinySeg().eval()
    probe = HeadProbe('decode.conv_seg', prediction_kind='per_pixel')
    assert probe.classifier(model) is model.decode.conv_seg
    x = images(n=2, size=6)
    prediction, [(features, logits)] = probe(model, x)
    assert features.shape == (2, 4, 6, 6) and logits.shape == (2, 5, 6, 6)
    assert prediction.shape == (2, 5, 12, 12)
    torch.testing.assert_close(model.decode.conv_seg(features), logits,
                               rtol=0, atol=0)
    features.sum().backward()
    assert model.body[1].weight.grad is not None
    with pytest.raises(ValueError, match='per-pixel probe needs'):
        HeadProbe(prediction_kind='per_pixel')


@pytest.mark.parametrize('classifier, match', [
    (nn.Conv2d(4, 5, 3, padding=1), r'kernel_size=\(3, 3\)'),
    (nn.Conv2d(4, 5, 1, stride=2), r'stride=\(2, 2\)'),
    (nn.Conv2d(4, 6, 1, groups=2), 'groups=2'),
    (nn.Conv2d(4, 5, 1, padding=1), r'padding=\(1, 1\)'),
])
def test_per_pixel_classifier_must_be_a_plain_1x1_conv(classifier, match):
    model = TinySeg(classifier)
    with pytest.raises(ValueError, match='head without a 1x1 classifier'):
        HeadProbe('decode.conv_seg', prediction_kind='per_pixel').find(model)
    with pytest.raises(ValueError, match=match):
        HeadProbe('decode.conv_seg', prediction_kind='per_pixel').find(model)


def test_per_pixel_probe_rejects_linear_and_non_4d_features():
    with pytest.raises(ValueError, match='not an nn.Conv2d'):
        HeadProbe('cls', prediction_kind='per_pixel').find(TwoHeads())

    class Unbatched(nn.Module):
        def __init__(self):
            super().__init__()
            self.head = nn.Conv2d(4, 3, 1)

        def forward(self, x):  # a 3-d (unbatched) input to the conv
            return self.head(x)

    with pytest.raises(ValueError, match='per_pixel outputs need 4-d'):
        HeadProbe('head', prediction_kind='per_pixel')(Unbatched(),
                                              torch.randn(4, 2, 2))
