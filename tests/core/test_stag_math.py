"""The STAG math (``mmseg_stag.core.stag``) checked against autograd and
naive reference formulas."""
import math

import pytest
import torch
import torch.nn.functional as F

from mmseg_stag.core import stag

DTYPE = torch.float64


def entropy(logits, dim=-1):
    log_p = F.log_softmax(logits, dim=dim)
    return -(log_p.exp() * log_p).sum(dim)


def make_classifier(num_classes=5, dim=7, seed=0, bias=True):
    gen = torch.Generator().manual_seed(seed)
    weight = torch.randn(num_classes, dim, generator=gen, dtype=DTYPE)
    b = torch.randn(num_classes, generator=gen, dtype=DTYPE) if bias else None
    return weight, b


def naive_stag_per_sample(features, weight, bias, anchors, eps, label='hard'):
    """Reference: materialise g = s h and take the paper's cosine literally."""
    logits = features @ weight.t() + (0 if bias is None else bias)
    log_p = F.log_softmax(logits, dim=1)
    p = log_p.exp()
    ent = -(p * log_p).sum(1, keepdim=True)
    sens_all = -p * (log_p + ent)
    if label == 'hard':
        pred = logits.argmax(1)
        s = sens_all[torch.arange(len(pred)), pred]
        g = s[:, None] * features
        a = anchors[pred]
        return -(g * a).sum(1) / (g.norm(dim=1) * a.norm(dim=1) + eps)
    losses = []
    for k in range(weight.shape[0]):
        g = sens_all[:, k:k + 1] * features
        a = anchors[k][None]
        cos = (g * a).sum(1) / (g.norm(dim=1) * a.norm(dim=1) + eps)
        losses.append(p[:, k] * cos)
    return -torch.stack(losses, 1).sum(1)


def test_old_import_path_is_the_core_module():
    import mmseg_stag
    assert mmseg_stag.stag is stag
    assert mmseg_stag.stag_loss is stag.stag_loss
    assert mmseg_stag.stag_beta is stag.stag_beta


def test_online_gradient_equals_autograd_of_entropy():
    weight, bias = make_classifier()
    features = torch.randn(6, 7, dtype=DTYPE)
    logits = features @ weight.t() + bias
    g = stag.online_gradient(features, logits)
    _, pred = stag.sample_sensitivity(logits)
    for i in range(features.shape[0]):
        w = weight.clone().requires_grad_(True)
        ent = entropy(w @ features[i] + bias)
        (grad_w, ) = torch.autograd.grad(ent, w)
        torch.testing.assert_close(g[i], grad_w[pred[i]], rtol=1e-10,
                                   atol=1e-12)


def test_sample_sensitivity_is_entropy_logit_derivative():
    logits = torch.randn(4, 6, dtype=DTYPE, requires_grad=True)
    sens, pred = stag.sample_sensitivity(logits.detach())
    (grad_z, ) = torch.autograd.grad(entropy(logits).sum(), logits)
    expected = grad_z[torch.arange(4), pred]
    torch.testing.assert_close(sens, expected, rtol=1e-10, atol=1e-12)
    # and the paper's closed form, eq:sample_sensitivity
    p = logits.detach().softmax(1)
    p_y = p[torch.arange(4), pred]
    closed = -p_y * (p_y.log() + entropy(logits.detach()))
    torch.testing.assert_close(sens, closed)


def test_structural_sensitivity_is_jacobian_diagonal():
    weight, bias = make_classifier(num_classes=6, dim=4, seed=1)
    z_matrix = stag.inter_class_logits(weight, bias)
    torch.testing.assert_close(z_matrix[2, 3], weight[3] @ weight[2] + bias[3])
    anchors = stag.structural_anchors(weight, bias, mode='diagonal')
    for k in range(weight.shape[0]):
        z_k = z_matrix[k].clone().requires_grad_(True)
        jac = torch.autograd.functional.jacobian(
            lambda z: entropy(z), z_k)  # dH_k / dZ_kj, j = 0..C-1
        s_k = jac[k]
        torch.testing.assert_close(anchors[k], s_k * weight[k], rtol=1e-10,
                                   atol=1e-12)
        # eq:structural_anchor closed form
        p = z_matrix[k].softmax(0)
        closed = -p[k] * (p[k].log() + entropy(z_matrix[k]))
        torch.testing.assert_close(s_k, closed)


def test_full_anchor_is_gradient_wrt_virtual_input():
    weight, bias = make_classifier(num_classes=5, dim=3, seed=2)
    anchors = stag.structural_anchors(weight, bias, mode='full')
    for k in range(weight.shape[0]):
        virtual = weight[k].clone().requires_grad_(True)
        ent = entropy(weight @ virtual + bias)
        (grad_v, ) = torch.autograd.grad(ent, virtual)
        torch.testing.assert_close(anchors[k], grad_v, rtol=1e-10, atol=1e-12)


def test_conv_weight_and_no_bias_accepted():
    weight, _ = make_classifier(bias=False)
    a2 = stag.structural_anchors(weight)
    a4 = stag.structural_anchors(weight[:, :, None, None])
    torch.testing.assert_close(a2, a4)
    z = stag.inter_class_logits(weight, None)
    torch.testing.assert_close(z, weight @ weight.t())


@pytest.mark.parametrize('label', ['hard', 'soft'])
@pytest.mark.parametrize('anchor', ['diagonal', 'full'])
def test_lean_loss_equals_naive_value_and_gradients(label, anchor):
    weight, bias = make_classifier(num_classes=5, dim=7, seed=3)
    anchors = stag.structural_anchors(weight, bias, mode=anchor)
    base = torch.randn(8, 7, dtype=DTYPE)

    feats_a = base.clone().requires_grad_(True)
    logits_a = feats_a @ weight.t() + bias
    logits_a.retain_grad()
    lean = stag.stag_loss(feats_a, logits_a, weight, bias, eps=1e-8,
                          anchor=anchor, label=label)
    lean.backward()

    feats_b = base.clone().requires_grad_(True)
    ref = naive_stag_per_sample(feats_b, weight, bias, anchors, 1e-8,
                                label).mean()
    ref.backward()
    torch.testing.assert_close(lean, ref, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(feats_a.grad, feats_b.grad, rtol=1e-8,
                               atol=1e-10)
    assert logits_a.grad.abs().sum() > 0, 'loss must not be detached from p'


def test_gradient_wrt_logits_matches_naive():
    weight, bias = make_classifier(seed=4)
    anchors = stag.structural_anchors(weight, bias)
    feats = torch.randn(5, 7, dtype=DTYPE)
    logits = (feats @ weight.t() + bias).requires_grad_(True)
    lean = stag.stag_alignment(feats, logits, anchors).mean()
    (g_lean, ) = torch.autograd.grad(lean, logits)

    logits2 = logits.detach().clone().requires_grad_(True)
    log_p = F.log_softmax(logits2, 1)
    p = log_p.exp()
    ent = -(p * log_p).sum(1, keepdim=True)
    pred = logits2.argmax(1)
    s = (-p * (log_p + ent))[torch.arange(5), pred]
    g = s[:, None] * feats
    a = anchors[pred]
    ref = (-(g * a).sum(1) / (g.norm(dim=1) * a.norm(dim=1) + 1e-8)).mean()
    (g_ref, ) = torch.autograd.grad(ref, logits2)
    torch.testing.assert_close(g_lean, g_ref, rtol=1e-8, atol=1e-10)


@pytest.mark.parametrize('label', ['hard', 'soft'])
def test_per_pixel_equals_per_sample_on_valid_pixels(label):
    weight, bias = make_classifier(num_classes=4, dim=6, seed=5)
    feats = torch.randn(2, 6, 3, 5, dtype=DTYPE, requires_grad=True)
    logits = torch.einsum('ndhw,cd->nchw', feats, weight) + bias.view(
        1, -1, 1, 1)
    mask = torch.rand(2, 3, 5, generator=torch.Generator().manual_seed(0)) > .3
    pix = stag.stag_loss(feats, logits, weight[:, :, None, None], bias,
                         label=label, valid_mask=mask)
    (g_pix, ) = torch.autograd.grad(pix, feats)

    flat_feats = feats.detach().permute(0, 2, 3, 1)[mask].requires_grad_(True)
    flat_logits = flat_feats @ weight.t() + bias
    per = stag.stag_loss(flat_feats, flat_logits, weight, bias, label=label)
    (g_flat, ) = torch.autograd.grad(per, flat_feats)
    torch.testing.assert_close(pix, per, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(g_pix.permute(0, 2, 3, 1)[mask], g_flat)
    assert g_pix.permute(0, 2, 3, 1)[~mask].abs().max() == 0


def test_all_invalid_mask_gives_zero_loss():
    weight, bias = make_classifier(num_classes=3, dim=2)
    feats = torch.randn(1, 2, 2, 2, dtype=DTYPE, requires_grad=True)
    logits = torch.randn(1, 3, 2, 2, dtype=DTYPE)
    loss = stag.stag_loss(feats, logits, weight, bias,
                          valid_mask=torch.zeros(1, 2, 2, dtype=torch.bool))
    assert loss.item() == 0
    loss.backward()
    assert torch.all(feats.grad == 0)


def test_confident_one_hot_is_finite():
    weight, bias = make_classifier(num_classes=4, dim=3)
    feats = torch.randn(3, 3, dtype=DTYPE, requires_grad=True)
    logits = (torch.eye(4, dtype=DTYPE)[[0, 2, 3]] * 1e4).requires_grad_(True)
    sens, _ = stag.sample_sensitivity(logits.detach())
    assert torch.all(sens == 0)
    loss = stag.stag_loss(feats, logits, weight, bias)
    loss.backward()
    assert loss.item() == 0  # 0 / (0 + eps)
    assert torch.isfinite(feats.grad).all()
    assert torch.isfinite(logits.grad).all()
    # zero features (||h|| = 0) as well
    zero = torch.zeros(2, 3, dtype=DTYPE, requires_grad=True)
    loss = stag.stag_loss(zero, torch.randn(2, 4, dtype=DTYPE), weight, bias)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(zero.grad).all()


def test_eps_enters_denominator_as_in_the_paper():
    weight, bias = make_classifier(seed=6)
    anchors = stag.structural_anchors(weight, bias)
    feats = torch.randn(4, 7, dtype=DTYPE)
    logits = feats @ weight.t() + bias
    for eps in (0.0, 1e-8, 0.1, 10.0):
        got = stag.stag_alignment(feats, logits, anchors, eps=eps)
        ref = naive_stag_per_sample(feats, weight, bias, anchors, eps)
        torch.testing.assert_close(got, ref, rtol=1e-10, atol=1e-12)
    # eps = 0: a pure cosine, so |L| <= 1 and equals -sign(s) cos(h, a)
    got = stag.stag_alignment(feats, logits, anchors, eps=0.0)
    assert torch.all(got.abs() <= 1 + 1e-12)
    # larger eps shrinks the loss magnitude monotonically
    small = stag.stag_alignment(feats, logits, anchors, eps=1e-8).abs()
    large = stag.stag_alignment(feats, logits, anchors, eps=10.0).abs()
    assert torch.all(large < small)


def test_beta_schedule_decays_per_step():
    beta0, gamma = 500.0, 35.0
    assert stag.stag_beta(beta0, gamma, 0) == beta0
    for t in range(5):
        assert math.isclose(stag.stag_beta(beta0, gamma, t + 1),
                            stag.stag_beta(beta0, gamma, t) *
                            math.exp(-1 / gamma))
    with pytest.raises(ValueError, match='gamma'):
        stag.stag_beta(1.0, 0.0, 1)


@pytest.mark.parametrize('features, logits, weight, bias, match', [
    ((4, 6), (4, 5), (5, 7), None, r'feature dim D=6.*D=7'),
    ((4, 7), (4, 3), (5, 7), None, r'number of classes C=3.*C=5'),
    ((4, 7, 2), (4, 5, 2), (5, 7), None, r'\[N, D\]'),
    ((4, 7, 2, 2), (4, 5), (5, 7), None, r'\[N, D, H, W\]'),
    ((4, 7, 2, 2), (4, 5, 2, 3), (5, 7), None, 'spatial'),
    ((4, 7), (4, 5), (5, 7, 3), None, r'weight must be \[C, D\]'),
    ((4, 7), (4, 5), (5, 7), (4, ), r'bias must have shape \[C\]'),
])
def test_bad_shapes_raise(features, logits, weight, bias, match):
    with pytest.raises(ValueError, match=match):
        stag.stag_loss(torch.randn(features), torch.randn(logits),
                       torch.randn(weight),
                       None if bias is None else torch.randn(bias))


@pytest.mark.parametrize('where', ['features', 'logits', 'weight'])
def test_non_finite_inputs_raise(where):
    tensors = dict(features=torch.randn(2, 3), logits=torch.randn(2, 4),
                   weight=torch.randn(4, 3))
    tensors[where][0, 0] = float('nan')
    with pytest.raises(ValueError, match='non-finite'):
        stag.stag_loss(tensors['features'], tensors['logits'],
                       tensors['weight'])


def test_bad_mask_and_modes_raise():
    with pytest.raises(ValueError, match='valid_mask'):
        stag.stag_loss(torch.randn(1, 3, 2, 2), torch.randn(1, 4, 2, 2),
                       torch.randn(4, 3),
                       valid_mask=torch.ones(1, 3, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match='anchor'):
        stag.structural_anchors(torch.randn(4, 3), mode='nope')
    with pytest.raises(ValueError, match='label'):
        stag.stag_alignment(torch.randn(2, 3), torch.randn(2, 4),
                            torch.randn(4, 3), label='nope')


def test_feature_norm_equals_vector_norm_values_and_gradients():
    """The one-pass norm of the lean STAG term: PyTorch's values and
    gradients (0 at a zero feature vector, as PyTorch's subgradient)."""
    base = torch.randn(2, 6, 3, 4, dtype=DTYPE)
    base[1, :, 2, 1] = 0.0  # a zero feature vector
    grad_out = torch.randn(2, 1, 3, 4, dtype=DTYPE)
    ours = base.clone().requires_grad_()
    ref = base.clone().requires_grad_()
    n_ours = stag.feature_norm(ours)
    n_ref = torch.linalg.vector_norm(ref, dim=1, keepdim=True)
    torch.testing.assert_close(n_ours, n_ref, rtol=0, atol=0)
    n_ours.backward(grad_out)
    n_ref.backward(grad_out)
    torch.testing.assert_close(ours.grad, ref.grad, rtol=1e-15, atol=1e-15)
    assert torch.all(ours.grad[1, :, 2, 1] == 0)
    flat = torch.randn(5, 7, dtype=DTYPE, requires_grad=True)
    assert torch.autograd.gradcheck(stag.feature_norm, (flat, ))


@pytest.mark.parametrize('label', ['hard', 'soft'])
def test_per_pixel_loss_gradients_equal_the_vector_norm_formula(label):
    """The whole per-pixel term (classifier frozen: projections from the
    logits) against the same formula written with ``vector_norm``."""
    from mmseg_stag.core import STAGLoss
    weight, bias = make_classifier(num_classes=4, dim=6, seed=5)
    anchors = stag.structural_anchors(weight, bias)
    base = torch.randn(2, 6, 3, 5, dtype=DTYPE)
    base[0, :, 1, 1] = 0.0

    def naive(h):
        logits = F.conv2d(h, weight[:, :, None, None], bias)
        p = F.softmax(logits, 1)
        sens = -p * (F.log_softmax(logits, 1) + entropy(logits, 1)[:, None])
        proj = torch.einsum('ndhw,cd->nchw', h, anchors)
        norm = torch.linalg.vector_norm(h, dim=1, keepdim=True)
        a_norm = anchors.norm(dim=1).view(1, -1, 1, 1)
        cos = sens * proj / (sens.abs() * norm * a_norm + 1e-8)
        if label == 'hard':
            return -cos.gather(1, logits.argmax(1, keepdim=True)).mean()
        return -(p * cos).sum(1).mean()

    ours = base.clone().requires_grad_()
    logits = F.conv2d(ours, weight[:, :, None, None], bias)
    loss = STAGLoss(label=label)(ours, logits, weight[:, :, None, None],
                                 bias)
    loss.backward()
    ref = base.clone().requires_grad_()
    expected = naive(ref)
    expected.backward()
    torch.testing.assert_close(loss, expected, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(ours.grad, ref.grad, rtol=1e-10, atol=1e-12)
