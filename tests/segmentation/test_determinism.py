"""``--deterministic`` on CUDA, checked on the CPU: in deterministic mode
the full-resolution loss is a log-softmax/gather cross-entropy of a
matmul resize (equal to ``F.cross_entropy`` of ``F.interpolate`` in float64,
gradients included), a whole TENT+STAG stream calls no aten op that raises
on CUDA there (recorded with a ``TorchDispatchMode``, ``F.interpolate``
routed as PyTorch routes CUDA tensors), and gives the same numbers twice;
``configure_determinism`` and ``configure_cuda_math``."""
import importlib
import inspect
import logging
import os.path as osp

import pytest
import torch
import torch.nn.functional as F
from nondeterministic_ops import (NONDETERMINISTIC_CUDA_OPS,
                                  ROUTED_BY_INTERPOLATE, raises_on_cuda)
from seg_helpers import (NVLABS_SEG_CFG, SEG_CFG, build_from_config,
                         make_runner, save_checkpoint, tiny_options)
from torch.utils._python_dispatch import TorchDispatchMode

from mmseg_stag.engine import determinism
from mmseg_stag.engine.determinism import (REMAINING_NONDETERMINISTIC_OPS,
                                           configure_cuda_math,
                                           configure_determinism)
from mmseg_stag.segmentation.task_adapter import (
    bilinear_resize, deterministic_cross_entropy,
    full_resolution_cross_entropy, interpolation_matrix)


class OpRecorder(TorchDispatchMode):
    """Records every aten op called inside it (forward and backward), and
    those that would raise on CUDA in deterministic mode."""

    def __init__(self):
        super().__init__()
        self.names, self.raising = set(), {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func.overloadpacket.__name__
        self.names.add(name)
        why = raises_on_cuda(func, args, kwargs)
        if why:
            self.raising[name] = why
        return func(*args, **kwargs)


@pytest.fixture
def deterministic():
    """``torch.use_deterministic_algorithms(True)``, and every global flag
    a runner or these tests set, restored afterwards."""
    cudnn = torch.backends.cudnn
    saved = (torch.are_deterministic_algorithms_enabled(),
             torch.is_deterministic_algorithms_warn_only_enabled(),
             cudnn.deterministic, cudnn.benchmark, cudnn.allow_tf32,
             torch.backends.cuda.matmul.allow_tf32)
    torch.use_deterministic_algorithms(True)
    yield
    torch.use_deterministic_algorithms(saved[0], warn_only=saved[1])
    (cudnn.deterministic, cudnn.benchmark, cudnn.allow_tf32,
     torch.backends.cuda.matmul.allow_tf32) = saved[2:]


def interpolate_as_on_cuda(monkeypatch):
    """``F.interpolate`` as it runs a CUDA tensor in deterministic mode:
    bilinear through ``_upsample_linear_vec`` (torch/nn/functional.py), so
    that the CPU records the ops CUDA would run. Any other call (e.g. with
    ``scale_factor``) keeps the CPU kernel and is recorded as such."""
    real = F.interpolate
    decompositions = importlib.import_module('torch._decomp.decompositions')

    def interpolate(input, size=None, scale_factor=None, mode='nearest',
                    align_corners=None, recompute_scale_factor=None,
                    antialias=False):
        if (mode == 'bilinear' and input.dim() == 4 and not antialias
                and size is not None and scale_factor is None
                and torch.are_deterministic_algorithms_enabled()):
            size = [size] * 2 if isinstance(size, int) else list(size)
            return decompositions._upsample_linear_vec(
                input, size, bool(align_corners), None)
        return real(input, size, scale_factor, mode, align_corners,
                    recompute_scale_factor, antialias)

    monkeypatch.setattr(F, 'interpolate', interpolate)


# ------------------------------------------------------ the loss, exactly
def labels_with_ignore(shape, num_classes, ignore_index, seed=0):
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, num_classes, shape, generator=g)
    labels[torch.rand(shape, generator=g) < 0.2] = ignore_index
    return labels


@pytest.mark.parametrize('ignore_index', [-100, 255, 3])
@pytest.mark.parametrize('shape', [(2, 5, 7, 9), (3, 4), (1, 19, 1, 6)])
def test_deterministic_cross_entropy_equals_f_cross_entropy(shape,
                                                            ignore_index):
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(shape, dtype=torch.float64, generator=g) * 3
    labels = labels_with_ignore((shape[0], ) + shape[2:], shape[1],
                                ignore_index)
    ours_in = logits.clone().requires_grad_()
    ref_in = logits.clone().requires_grad_()
    ours = deterministic_cross_entropy(ours_in, labels, ignore_index)
    ref = F.cross_entropy(ref_in, labels, ignore_index=ignore_index)
    torch.testing.assert_close(ours, ref, rtol=1e-12, atol=1e-12)
    ours.backward()
    ref.backward()
    torch.testing.assert_close(ours_in.grad, ref_in.grad, rtol=1e-12,
                               atol=1e-14)


def test_deterministic_cross_entropy_all_ignored_is_nan_like_torch():
    logits = torch.randn(1, 3, 2, 2, dtype=torch.float64)
    labels = torch.full((1, 2, 2), 255)
    assert torch.isnan(deterministic_cross_entropy(logits, labels, 255))
    assert torch.isnan(F.cross_entropy(logits, labels, ignore_index=255))


RESIZES = [
    ((17, 30), (135, 240)),  # 135x240 -> 1080x1920 scaled down by 8: x8
    ((16, 8), (48, 96)),  # the tests' tiny ACDC: head 1/4 of 32x64 -> 48x96
    ((5, 7), (13, 11)),  # up, non-integer factors
    ((20, 30), (7, 9)),  # down
    ((6, 6), (6, 6)),  # same size
    ((1, 4), (5, 1)),  # size 1 either side
]


@pytest.mark.parametrize('align_corners', [False, True])
@pytest.mark.parametrize('size_in,size_out', RESIZES)
def test_bilinear_resize_equals_interpolate(size_in, size_out,
                                            align_corners):
    g = torch.Generator().manual_seed(2)
    x = torch.randn((2, 3) + size_in, dtype=torch.float64, generator=g)
    grad_out = torch.randn((2, 3) + size_out, dtype=torch.float64,
                           generator=g)
    ours_in = x.clone().requires_grad_()
    ref_in = x.clone().requires_grad_()
    ours = bilinear_resize(ours_in, size_out, align_corners)
    ref = F.interpolate(ref_in, size=size_out, mode='bilinear',
                        align_corners=align_corners)
    torch.testing.assert_close(ours, ref, rtol=1e-12, atol=1e-12)
    ours.backward(grad_out)
    ref.backward(grad_out)
    torch.testing.assert_close(ours_in.grad, ref_in.grad, rtol=1e-12,
                               atol=1e-12)


def test_interpolation_matrix_rows_sum_to_one():
    for n_in, n_out in [(135, 1080), (240, 1920), (30, 7), (1, 5)]:
        m = interpolation_matrix(n_in, n_out, False,
                                 torch.empty(0, dtype=torch.float64))
        assert m.shape == (n_out, n_in)
        torch.testing.assert_close(m.sum(1), torch.ones(n_out,
                                                        dtype=torch.float64))


def test_bilinear_resize_keeps_float32_under_autocast():
    x = torch.randn(1, 3, 4, 5).to(torch.bfloat16)
    with torch.autocast('cpu', dtype=torch.bfloat16):
        out = bilinear_resize(x, (8, 10))
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, F.interpolate(
        x.float(), size=(8, 10), mode='bilinear', align_corners=False))


def full_resolution_inputs(dtype=torch.float32):
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(1, 19, 16, 8, dtype=dtype, generator=g)
    labels = torch.randint(0, 19, (1, 64, 32), generator=g)
    return logits, labels


def test_full_resolution_loss_default_path_is_unchanged():
    """Outside deterministic mode: F.interpolate and F.cross_entropy, bit
    for bit (float32)."""
    assert not torch.are_deterministic_algorithms_enabled()
    logits, labels = full_resolution_inputs()
    ref = F.cross_entropy(F.interpolate(logits, size=(64, 32),
                                        mode='bilinear',
                                        align_corners=False), labels)
    assert torch.equal(full_resolution_cross_entropy(logits, labels), ref)


def test_full_resolution_loss_deterministic_path_equals_default(
        deterministic):
    logits, labels = full_resolution_inputs(torch.float64)
    ours_in = logits.clone().requires_grad_()
    ours = full_resolution_cross_entropy(ours_in, labels)
    ours.backward()
    torch.use_deterministic_algorithms(False)
    ref_in = logits.clone().requires_grad_()
    ref = full_resolution_cross_entropy(ref_in, labels)
    ref.backward()
    torch.testing.assert_close(ours, ref, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(ours_in.grad, ref_in.grad, rtol=1e-12,
                               atol=1e-14)


def old_full_resolution_cross_entropy(logits, labels, align_corners=False):
    """The loss before this change (the default path, in every mode)."""
    logits = F.interpolate(logits, size=labels.shape[-2:], mode='bilinear',
                           align_corners=align_corners)
    return F.cross_entropy(logits, labels.long())


def test_full_resolution_loss_calls_no_op_that_raises_on_cuda(deterministic):
    """Neither ``nll_loss2d`` nor a bilinear backward in deterministic mode
    (the old loss called both)."""
    logits, labels = full_resolution_inputs()
    for fn, expected in [(full_resolution_cross_entropy, set()),
                         (old_full_resolution_cross_entropy,
                          {'nll_loss2d_forward',
                           'upsample_bilinear2d_backward'})]:
        x = logits.clone().requires_grad_()
        with OpRecorder() as ops:
            fn(x, labels).backward()
        assert set(ops.raising) == expected, fn.__name__


# ---------------------------------------------------- the stream on CUDA
def stream(config, tiny_acdc, checkpoint, work_dir):
    """A whole TENT+STAG stream (8 images) in deterministic mode: its
    metrics and adapted parameters."""
    runner = make_runner('tent-stag', tiny_acdc, checkpoint, work_dir,
                         config=config,
                         extra={'randomness.deterministic': True})
    assert torch.are_deterministic_algorithms_enabled()
    metrics = runner.test()
    params = {k: v.detach().clone()
              for k, v in runner.model.named_parameters()}
    return metrics, params, runner


@pytest.mark.parametrize('config', [SEG_CFG, NVLABS_SEG_CFG])
def test_stream_calls_no_op_that_raises_on_cuda(config, tiny_acdc,
                                                tiny_checkpoint, tmp_path,
                                                deterministic, monkeypatch):
    """Every batch's prediction, TENT+STAG update and IoU record: no aten op
    without a deterministic CUDA kernel, except the documented remaining
    ones (none for this method); the head's bilinear resizes take
    PyTorch's deterministic route."""
    checkpoint = tiny_checkpoint
    if config == NVLABS_SEG_CFG:
        model, _ = build_from_config(config.format('tent-stag'),
                                     tiny_options(tiny_acdc, head='nvlabs'))
        checkpoint = save_checkpoint(model, tmp_path / 'nvlabs.pth')
    interpolate_as_on_cuda(monkeypatch)
    with OpRecorder() as ops:
        _, _, runner = stream(config, tiny_acdc, checkpoint,
                              tmp_path / 'run')
    assert runner.test_loop.method.num_updates == 8
    # not even REMAINING_NONDETERMINISTIC_OPS: TENT's loss here is
    # pseudo_ce_fullres, no nll_loss2d
    assert ops.raising == {}, ops.raising
    assert {'gather', 'scatter_add_', 'mm'} <= ops.names  # the new paths ran
    assert not ops.names & set(ROUTED_BY_INTERPOLATE)


def test_stream_is_repeatable_in_deterministic_mode(tiny_acdc,
                                                    tiny_checkpoint,
                                                    tmp_path, deterministic):
    first = stream(SEG_CFG, tiny_acdc, tiny_checkpoint, tmp_path / 'a')
    second = stream(SEG_CFG, tiny_acdc, tiny_checkpoint, tmp_path / 'b')
    assert first[0] == second[0]
    assert first[1].keys() == second[1].keys()
    for key, value in first[1].items():
        assert torch.equal(value, second[1][key]), key
    assert first[2].test_loop.method.num_updates == 8


def test_loop_configures_determinism_and_tf32(tiny_acdc, tiny_checkpoint,
                                              tmp_path, deterministic):
    """The loop's ``tf32`` option and its ``configure_determinism`` call:
    warn-only deterministic mode, TF32 off, and the one log line."""
    from mmseg_stag.engine.online_loop import OnlineAdaptationLoop
    if 'tf32' not in inspect.signature(
            OnlineAdaptationLoop.__init__).parameters:
        pytest.skip('OnlineAdaptationLoop has no tf32 option yet')
    runner = make_runner('tent-stag', tiny_acdc, tiny_checkpoint, tmp_path,
                         extra={'randomness.deterministic': True,
                                'test_cfg.tf32': False})
    runner.test()
    assert torch.is_deterministic_algorithms_warn_only_enabled()
    assert torch.backends.cuda.matmul.allow_tf32 is False
    assert torch.backends.cudnn.allow_tf32 is False
    log = osp.join(runner.log_dir, f'{runner.timestamp}.log')
    with open(log) as f:
        lines = [line for line in f if 'deterministic mode (warn_only)' in
                 line]
    assert len(lines) == 1 and 'tf32 cudnn=False' in lines[0]


# ------------------------------------------------------ the configuration
def grad_input(*shape):
    return torch.randn(*shape, requires_grad=True)


def backward(y):
    y.sum().backward()


#: one CPU call of each operation PyTorch documents as raising on CUDA
DOCUMENTED = {
    'AvgPool3d': lambda: backward(torch.nn.AvgPool3d(3)(grad_input(
        2, 3, 3, 3))),
    'AdaptiveAvgPool2d': lambda: backward(torch.nn.AdaptiveAvgPool2d(3)(
        grad_input(2, 3, 5, 5))),
    'AdaptiveAvgPool3d': lambda: backward(torch.nn.AdaptiveAvgPool3d(3)(
        grad_input(2, 3, 5, 5, 5))),
    'AdaptiveMaxPool2d': lambda: backward(torch.nn.AdaptiveMaxPool2d(3)(
        grad_input(2, 3, 5, 5))),
    'FractionalMaxPool2d': lambda: backward(torch.nn.FractionalMaxPool2d(
        2, output_ratio=0.5)(grad_input(2, 3, 4, 4))),
    'FractionalMaxPool3d': lambda: backward(torch.nn.FractionalMaxPool3d(
        2, output_ratio=0.5)(grad_input(2, 3, 4, 4, 4))),
    'MaxUnpool1d': lambda: torch.nn.MaxUnpool1d(3, 1)(
        torch.randn(1, 1, 7), torch.zeros(1, 1, 7, dtype=torch.long)),
    'MaxUnpool2d': lambda: torch.nn.MaxUnpool2d(3, 1)(
        torch.randn(1, 1, 7, 7), torch.zeros(1, 1, 7, 7, dtype=torch.long)),
    'MaxUnpool3d': lambda: torch.nn.MaxUnpool3d(3, 1)(
        torch.randn(1, 1, 7, 7, 7),
        torch.zeros(1, 1, 7, 7, 7, dtype=torch.long)),
    'interpolate linear': lambda: backward(F.interpolate(
        grad_input(1, 2, 4), size=12, mode='linear', align_corners=False)),
    'interpolate bilinear': lambda: backward(F.interpolate(
        grad_input(1, 2, 4, 4), size=12, mode='bilinear',
        align_corners=False)),
    'interpolate bicubic': lambda: backward(F.interpolate(
        grad_input(1, 2, 4, 4), size=12, mode='bicubic',
        align_corners=False)),
    'interpolate trilinear': lambda: backward(F.interpolate(
        grad_input(1, 2, 4, 4, 4), size=12, mode='trilinear',
        align_corners=False)),
    'ReflectionPad1d': lambda: backward(torch.nn.ReflectionPad1d(2)(
        grad_input(1, 2, 5))),
    'ReflectionPad2d': lambda: backward(torch.nn.ReflectionPad2d(2)(
        grad_input(1, 2, 5, 5))),
    'ReflectionPad3d': lambda: backward(torch.nn.ReflectionPad3d(2)(
        grad_input(1, 2, 5, 5, 5))),
    'NLLLoss': lambda: torch.nn.NLLLoss()(torch.randn(2, 3, 5, 5),
                                          torch.randint(0, 3, (2, 5, 5))),
    'CTCLoss': lambda: backward(torch.nn.CTCLoss()(
        grad_input(50, 3, 15).log_softmax(2),
        torch.randint(1, 14, (3, 30)), [50] * 3, [30, 25, 20])),
    "EmbeddingBag(mode='max')": lambda: backward(torch.nn.EmbeddingBag(
        4, 3, mode='max')(torch.randint(0, 3, (4, 3)))),
    'put_': lambda: torch.zeros(10).put_(torch.tensor([0, 0]),
                                         torch.tensor([0., 1.])),
    'put_ accumulate': lambda: torch.zeros(10).put_(
        torch.tensor([0, 0]), torch.tensor([0., 1.]), accumulate=True),
    'histc': lambda: torch.histc(torch.rand(5), bins=3, min=0, max=1),
    'bincount with weights': lambda: torch.bincount(
        torch.tensor([0, 1]), torch.tensor([1., 2.])),
    'median with indices': lambda: torch.median(torch.randn(5), 0),
    'grid_sample 2d': lambda: backward(F.grid_sample(
        grad_input(1, 1, 2, 2), torch.zeros(1, 1, 1, 2),
        align_corners=False)),
    'grid_sample 3d': lambda: backward(F.grid_sample(
        grad_input(1, 1, 2, 2, 2), torch.zeros(1, 1, 1, 1, 3),
        align_corners=False)),
    'cumsum float': lambda: torch.cumsum(torch.randn(5), 0),
    "scatter_reduce(reduce='prod')": lambda: torch.zeros(3).scatter_reduce(
        0, torch.tensor([0, 0]), torch.tensor([1., 2.]), reduce='prod'),
    'kthvalue': lambda: torch.kthvalue(torch.randn(5), 2),
}
#: their variants with a deterministic CUDA kernel
DETERMINISTIC = {
    'bincount': lambda: torch.bincount(torch.tensor([0, 1])),
    'median': lambda: torch.median(torch.randn(5)),
    'cumsum int': lambda: torch.cumsum(torch.arange(5), 0),
    "scatter_reduce(reduce='sum')": lambda: torch.zeros(3).scatter_reduce(
        0, torch.tensor([0, 0]), torch.tensor([1., 2.]), reduce='sum'),
    "NLLLoss(reduction='none')": lambda: F.nll_loss(
        torch.randn(2, 3, 5, 5), torch.randint(0, 3, (2, 5, 5)),
        reduction='none'),
    'NLLLoss of [N, C]': lambda: F.nll_loss(torch.randn(4, 3),
                                            torch.randint(0, 3, (4, ))),
    "EmbeddingBag(mode='sum')": lambda: backward(torch.nn.EmbeddingBag(
        4, 3, mode='sum')(torch.randint(0, 3, (4, 3)))),
    'log_softmax and gather': lambda: backward(deterministic_cross_entropy(
        grad_input(2, 3, 4, 4), torch.randint(0, 3, (2, 4, 4)))),
    'bilinear_resize': lambda: backward(bilinear_resize(
        grad_input(1, 2, 4, 4), (12, 12))),
}


@pytest.mark.parametrize('name', sorted(DOCUMENTED))
def test_op_list_names_each_documented_operation(name):
    with OpRecorder() as ops:
        DOCUMENTED[name]()
    assert ops.raising, f'{name}: no op named among {sorted(ops.names)}'


@pytest.mark.parametrize('name', sorted(DETERMINISTIC))
def test_op_list_spares_the_deterministic_variants(name):
    with OpRecorder() as ops:
        DETERMINISTIC[name]()
    assert ops.raising == {}


def test_op_list_includes_the_routed_resizes():
    assert set(ROUTED_BY_INTERPOLATE) <= set(NONDETERMINISTIC_CUDA_OPS)
    assert set(REMAINING_NONDETERMINISTIC_OPS) <= set(
        NONDETERMINISTIC_CUDA_OPS)


def test_configure_determinism_warns_only_and_logs_one_line(deterministic):
    logger = logging.getLogger('test_configure_determinism')
    lines = []
    handler = logging.Handler()
    handler.emit = lambda record: lines.append(record.getMessage())
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        assert configure_determinism(logger)
        assert torch.are_deterministic_algorithms_enabled()
        assert torch.is_deterministic_algorithms_warn_only_enabled()
        torch.use_deterministic_algorithms(False)
        assert not configure_determinism(logger)  # off: nothing changes
        assert not torch.are_deterministic_algorithms_enabled()
    finally:
        logger.removeHandler(handler)
    assert len(lines) == 1
    for word in list(REMAINING_NONDETERMINISTIC_OPS) + [
            'warn_only', 'cudnn.deterministic=', 'cudnn.benchmark=']:
        assert word in lines[0]


def test_configure_determinism_strict_keeps_errors(deterministic):
    assert configure_determinism(logging.getLogger('strict'),
                                 warn_only=False)
    assert not torch.is_deterministic_algorithms_warn_only_enabled()


@pytest.mark.parametrize('tf32', [True, False])
def test_configure_cuda_math(tf32, deterministic):
    configure_cuda_math(tf32)
    assert torch.backends.cuda.matmul.allow_tf32 is tf32
    assert torch.backends.cudnn.allow_tf32 is tf32
    configure_cuda_math(None)  # keeps what is set
    assert torch.backends.cuda.matmul.allow_tf32 is tf32
    assert torch.backends.cudnn.allow_tf32 is tf32
    assert determinism.tf32_state() == (f'tf32 matmul={tf32}, '
                                         f'tf32 cudnn={tf32}')
