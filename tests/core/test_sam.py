"""``SAM`` (non-adaptive, around a built base optimizer) against a hand
computation in float64: ``first_step`` moves to ``theta + rho g / (||g|| +
1e-12)``, ``second_step`` moves back and steps the base optimizer with the
gradients taken at the perturbed point."""
import pytest
import torch

from mmseg_stag.core import SAM

DTYPE = torch.float64
LR, MOMENTUM, RHO = 0.1, 0.9, 0.05


def tensors(seed, *shapes):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(s, dtype=DTYPE, generator=gen) for s in shapes]


def make(rho=RHO, groups=None):
    """Parameters ``a [2, 3]``, ``b [4]`` (with gradients) and ``c [3]``
    (never given one), SGD with momentum, SAM around it."""
    a, b, c = (p.requires_grad_(True) for p in tensors(0, (2, 3), (4, ),
                                                        (3, )))
    sgd = torch.optim.SGD(groups(a, b, c) if groups else [a, b, c], lr=LR,
                          momentum=MOMENTUM)
    return (a, b, c), sgd, SAM(sgd, rho=rho)


def set_grads(params, grads):
    for p, g in zip(params, grads):
        p.grad = g.clone()


def test_two_sam_steps_by_hand():
    (a, b, c), sgd, sam = make()
    a0, b0, c0 = a.detach().clone(), b.detach().clone(), c.detach().clone()
    buffers = None
    for step in range(2):
        g = tensors(10 + step, (2, 3), (4, ))  # gradients at theta
        h = tensors(20 + step, (2, 3), (4, ))  # gradients at theta + e_w
        set_grads((a, b), g)
        norm = torch.sqrt(sum((x ** 2).sum() for x in g))
        assert sam.grad_norm().item() == pytest.approx(norm.item(),
                                                       rel=1e-15)
        sam.first_step()
        e = [RHO * x / (norm + 1e-12) for x in g]
        torch.testing.assert_close(a, a0 + e[0], rtol=1e-15, atol=1e-15)
        torch.testing.assert_close(b, b0 + e[1], rtol=1e-15, atol=1e-15)
        assert torch.equal(c, c0) and 'old_p' not in sam.state[c]
        assert torch.equal(sam.state[a]['old_p'], a0)
        assert torch.equal(sam.state[b]['old_p'], b0)
        e_norm = torch.sqrt(sum((x ** 2).sum() for x in e))
        assert e_norm.item() == pytest.approx(RHO, rel=1e-12)

        set_grads((a, b), h)
        sam.second_step()
        # SGD with momentum (dampening 0): buf = m buf + h, theta -= lr buf
        buffers = [x.clone() for x in h] if buffers is None else [
            MOMENTUM * buf + x for buf, x in zip(buffers, h)]
        a0, b0 = a0 - LR * buffers[0], b0 - LR * buffers[1]
        torch.testing.assert_close(a, a0, rtol=1e-15, atol=1e-15)
        torch.testing.assert_close(b, b0, rtol=1e-15, atol=1e-15)
        assert torch.equal(c, c0)
        assert 'old_p' not in sam.state[a] and 'old_p' not in sam.state[b]
        a0, b0 = a.detach().clone(), b.detach().clone()  # on from here
        for p, buf in zip((a, b), buffers):
            torch.testing.assert_close(sgd.state[p]['momentum_buffer'], buf,
                                       rtol=1e-15, atol=1e-15)
        sam.zero_grad()
        assert a.grad is None and b.grad is None


def test_per_group_rho_and_shared_param_groups():
    (a, b, c), sgd, sam = make(
        groups=lambda a, b, c: [dict(params=[a], rho=0.2),
                                dict(params=[b, c])])
    assert sam.param_groups is sgd.param_groups
    assert [g['rho'] for g in sam.param_groups] == [0.2, RHO]
    assert sam.base_optimizer is sgd
    a0, b0 = a.detach().clone(), b.detach().clone()
    g = tensors(1, (2, 3), (4, ))
    set_grads((a, b), g)
    norm = torch.sqrt(sum((x ** 2).sum() for x in g))  # over all groups
    sam.first_step()
    torch.testing.assert_close(a, a0 + 0.2 * g[0] / (norm + 1e-12),
                               rtol=1e-15, atol=1e-15)
    torch.testing.assert_close(b, b0 + RHO * g[1] / (norm + 1e-12),
                               rtol=1e-15, atol=1e-15)


def test_unperturb_no_gradients_and_zero_rho():
    (a, b, c), sgd, sam = make()
    a0, b0 = a.detach().clone(), b.detach().clone()
    # no gradient at all: first_step does nothing, unperturb neither
    sam.first_step()
    sam.unperturb()
    assert torch.equal(a, a0) and torch.equal(b, b0)
    assert all('old_p' not in sam.state[p] for p in (a, b, c))
    # unperturb returns to theta wherever first_step moved, once
    set_grads((a, b), tensors(2, (2, 3), (4, )))
    sam.first_step()
    assert not torch.equal(a, a0)
    sam.unperturb()
    assert torch.equal(a, a0) and torch.equal(b, b0)
    sam.unperturb()
    assert torch.equal(a, a0) and torch.equal(b, b0)
    # rho = 0: no perturbation
    (a, b, c), _, sam = make(rho=0.0)
    a0 = a.detach().clone()
    set_grads((a, b), tensors(2, (2, 3), (4, )))
    sam.first_step()
    assert torch.equal(a, a0)


def test_bad_uses_raise():
    _, sgd, sam = make()
    with pytest.raises(RuntimeError, match='first_step'):
        sam.step()
    with pytest.raises(ValueError, match='rho'):
        SAM(sgd, rho=-0.1)
