"""``STAGLoss``: the core's plain ``nn.Module``, and the same class built
through MMSeg's ``MODELS`` registry (registered by ``import mmseg_stag``
when MMSeg is installed)."""
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn as nn
from host_syncs import HostSyncCounter
from mmseg.registry import MODELS

import mmseg_stag  # noqa: F401  (registers STAGLoss into MMSeg's MODELS)
from mmseg_stag.core import STAGLoss, stag


@pytest.fixture(params=['core', 'mmseg'])
def build_loss(request):
    """``build_loss(**options)``: ``STAGLoss(**options)`` directly, or
    ``MODELS.build(dict(type='STAGLoss', **options))``."""
    if request.param == 'core':
        return lambda **options: STAGLoss(**options)
    return lambda **options: MODELS.build(dict(type='STAGLoss', **options))


def test_registered_class_is_the_core_module():
    assert MODELS.get('STAGLoss') is STAGLoss
    assert isinstance(MODELS.build(dict(type='STAGLoss')), nn.Module)


def test_build_and_call(build_loss):
    loss = build_loss()
    head = nn.Conv2d(8, 5, 1)
    feats = torch.randn(2, 8, 4, 6, requires_grad=True)
    logits = head(feats)
    value = loss(feats, logits, head.weight, head.bias)
    assert value.dim() == 0
    expected = stag.stag_loss(feats, logits, head.weight, head.bias)
    torch.testing.assert_close(value, expected)
    value.backward()
    assert feats.grad is not None and head.weight.grad is not None


def test_options_are_passed_through(build_loss):
    torch.manual_seed(0)
    fc = nn.Linear(6, 4)
    feats = torch.randn(5, 6)
    logits = fc(feats)
    for anchor in ('diagonal', 'full'):
        for label in ('hard', 'soft'):
            loss = build_loss(eps=1e-3, anchor=anchor, label=label)
            expected = stag.stag_loss(feats, logits, fc.weight, fc.bias,
                                      eps=1e-3, anchor=anchor, label=label)
            torch.testing.assert_close(
                loss(feats, logits, fc.weight, fc.bias), expected)


def test_bad_options_raise(build_loss):
    for bad in (dict(anchor='row'), dict(label='fuzzy'), dict(eps=-1.0)):
        with pytest.raises(ValueError, match='STAGLoss'):
            build_loss(**bad)


def test_anchor_cache_follows_classifier_updates(build_loss):
    loss = build_loss()
    fc = nn.Linear(4, 3)
    feats = torch.randn(2, 4)
    for _ in range(3):
        loss(feats, fc(feats), fc.weight, fc.bias)
    assert loss.anchor_computations == 1, 'frozen classifier: anchors once'

    optim = torch.optim.SGD(fc.parameters(), lr=0.1)
    for step in range(2):
        out = loss(feats, fc(feats), fc.weight, fc.bias)
        optim.zero_grad()
        out.backward()
        optim.step()
        fresh = stag.structural_anchors(fc.weight.detach(), fc.bias.detach())
        torch.testing.assert_close(loss.anchors(fc.weight, fc.bias), fresh)
    # one recomputation per optimizer step (the first call reused the cache)
    assert loss.anchor_computations == 3
    # replacing the tensor also invalidates the cache
    fc.weight = nn.Parameter(torch.randn(3, 4))
    torch.testing.assert_close(
        loss.anchors(fc.weight, fc.bias),
        stag.structural_anchors(fc.weight.detach(), fc.bias.detach()))


def test_custom_imports_in_config_registers_loss(tmp_path):
    """A fresh interpreter that only reads a config with ``custom_imports``."""
    cfg_file = tmp_path / 'stag_cfg.py'
    cfg_file.write_text(textwrap.dedent("""
        custom_imports = dict(imports=['mmseg_stag'],
                              allow_failed_imports=False)
        stag_loss = dict(type='STAGLoss', anchor='full')
    """))
    script = textwrap.dedent(f"""
        import torch
        from mmengine.config import Config
        from mmseg.registry import MODELS
        cfg = Config.fromfile({str(cfg_file)!r})
        loss = MODELS.build(cfg.stag_loss)
        fc = torch.nn.Linear(3, 4)
        x = torch.randn(2, 3)
        print(type(loss).__name__, loss.anchor,
              float(loss(x, fc(x), fc.weight, fc.bias)))
    """)
    out = subprocess.run([sys.executable, '-c', script], check=True,
                         capture_output=True, text=True).stdout
    name, anchor, value = out.split()
    assert name == 'STAGLoss' and anchor == 'full'
    assert -1.0 <= float(value) <= 1.0


@pytest.mark.parametrize('anchor', ['diagonal', 'full'])
@pytest.mark.parametrize('label', ['hard', 'soft'])
@pytest.mark.parametrize('per_pixel', [False, True])
def test_frozen_classifier_projects_from_logits(anchor, label, per_pixel):
    """With a frozen classifier weight the projections come from the logits:
    same loss and same gradients on every upstream parameter as projecting
    the features (the reference ``stag.stag_loss``), a trainable bias
    included (it reaches the loss only through the sensitivities)."""
    torch.manual_seed(1)
    dtype = torch.float64
    body = nn.Sequential(nn.Linear(5, 7), nn.LayerNorm(7), nn.ReLU()) \
        .to(dtype)
    head = (nn.Conv2d(7, 4, 1) if per_pixel else nn.Linear(7, 4)).to(dtype)
    head.weight.requires_grad_(False)
    x = torch.randn(3, 5, 2, 3, dtype=dtype) if per_pixel else \
        torch.randn(6, 5, dtype=dtype)
    loss = STAGLoss(anchor=anchor, label=label)

    def features(x):
        if per_pixel:
            return body(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)
        return body(x)

    def grads(value):
        params = list(body.parameters()) + [head.bias]
        return torch.autograd.grad(value, params, allow_unused=True)

    h = features(x)
    z = head(h)
    got = loss(h, z, head.weight, head.bias)
    g_got = grads(got)
    h = features(x)
    z = head(h)
    ref = stag.stag_loss(h, z, head.weight, head.bias, anchor=anchor,
                         label=label)
    g_ref = grads(ref)
    torch.testing.assert_close(got, ref, rtol=1e-10, atol=1e-12)
    for a, b in zip(g_got, g_ref):
        torch.testing.assert_close(a, b, rtol=1e-8, atol=1e-10)
    assert all(g.abs().max() > 0 for g in g_got)


@pytest.mark.parametrize('per_pixel', [False, True])
@pytest.mark.parametrize('frozen', [True, False])
def test_no_host_read_without_check_finite(per_pixel, frozen):
    """``check_finite=False`` (the online methods'): once the anchors and
    the shapes are checked, a forward and backward of the term read
    nothing back to the host (on a GPU: no wait for the device;
    tests/host_syncs.py for what is counted)."""
    torch.manual_seed(0)
    head = nn.Conv2d(7, 5, 1) if per_pixel else nn.Linear(7, 5)
    head.weight.requires_grad_(not frozen)
    h = torch.randn((3, 7, 2, 3) if per_pixel else (6, 7),
                    requires_grad=True)
    z = head(h).detach().requires_grad_()
    loss = STAGLoss(check_finite=False)
    loss(h, z, head.weight, head.bias)  # the anchors, the shape checks
    counter = HostSyncCounter()
    with counter:
        loss(h, z, head.weight, head.bias).backward()
    assert counter.calls == []
    assert h.grad.abs().max() > 0 and z.grad.abs().max() > 0


def test_class_token_view_does_not_keep_the_token_map():
    """Features that are a strided view (a ViT's class token ``x[:, 0]``):
    what the loss saves for its backward must not hold the whole
    ``[N, T, D]`` token map, and the gradients are those of a copy."""
    torch.manual_seed(0)
    n, t, d, c = 4, 50, 16, 3
    scale = torch.ones(d, requires_grad=True)
    head = nn.Linear(d, c)
    head.weight.requires_grad_(False)
    loss_fn = STAGLoss()
    inputs = torch.randn(n, t, d)

    def run(copy_token):
        tokens = inputs * scale  # [N, T, D], in the graph
        h = tokens[:, 0].contiguous() if copy_token else tokens[:, 0]
        z = head(h)
        storages = {}

        def pack(tensor):
            storage = tensor.untyped_storage()
            storages[storage.data_ptr()] = storage.nbytes()
            return tensor

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda x: x):
            value = loss_fn(h, z, head.weight, head.bias)
        grad, = torch.autograd.grad(value, [scale])
        return value, grad, storages, tokens.untyped_storage().nbytes()

    value, grad, storages, token_bytes = run(copy_token=False)
    assert storages and max(storages.values()) < token_bytes
    ref_value, ref_grad, _, _ = run(copy_token=True)
    torch.testing.assert_close(value, ref_value)
    torch.testing.assert_close(grad, ref_grad)
    assert grad.abs().max() > 0


@pytest.mark.parametrize('frozen', [True, False])
def test_mixed_precision_term_is_float32(frozen):
    """Under bfloat16 autocast the term is computed in float32 (its value
    and its gradients agree with a float32 computation to bfloat16's
    rounding of the inputs); gradients reach the features in their own
    dtype."""
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(16, 5, 1)
    conv.weight.requires_grad_(not frozen)
    base = torch.randn(2, 16, 5, 6).bfloat16().float()  # exact in bf16
    loss_fn = STAGLoss()

    ref_h = base.clone().requires_grad_()
    ref = loss_fn(ref_h, conv(ref_h), conv.weight, conv.bias)
    ref.backward()

    h = base.bfloat16().requires_grad_()
    with torch.autocast('cpu', dtype=torch.bfloat16):
        logits = conv(h)
        assert logits.dtype == torch.bfloat16
        loss = loss_fn(h, logits, conv.weight, conv.bias)
    assert loss.dtype == torch.float32
    loss.backward()
    assert h.grad.dtype == torch.bfloat16
    # bf16 logits carry ~3 significant digits
    torch.testing.assert_close(loss, ref, rtol=2e-2, atol=2e-3)
    torch.testing.assert_close(h.grad.float(), ref_h.grad, rtol=5e-2,
                               atol=5e-4)
