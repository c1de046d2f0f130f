"""Every method, with and without STAG, a few steps in float32, bfloat16
and float16 on the device: the real configs shrunk to a tiny SegFormer on
the tiny ACDC-layout stream (EcoTTA: its classification config on a tiny
CNN), through MMEngine's ``Runner`` and the online loop. Each run ends
with its results, every parameter and buffer finite and on the device,
finite logged losses, the classifier run under the precision asked for,
and an update on every batch kept by an updating method. SAR may refuse
float16 (it cannot scale its SAM gradients): the test accepts a finite run
or that refusal, and says which."""
import json
import os.path as osp

import pytest
from cuda_runs import (CIFAR_NAMES, Run, assert_finite_numbers,
                       assert_finite_on, cls_options, config_of,
                       device_precisions, is_classification, seg_options,
                       use_device)

#: the segmentation methods (Source has no +STAG config: it never updates)
SEG_METHODS = ('source', 'bn-adapt', 'bn-adapt-stag', 'tent', 'tent-stag',
               'eata', 'eata-stag', 'sar', 'sar-stag', 'deyo', 'deyo-stag',
               'cotta', 'cotta-stag')
#: EcoTTA is a classification method (continual CIFAR-C)
CLS_METHODS = ('ecotta-k4', 'ecotta-k4-stag')
#: methods that may refuse float16 before the first batch
MAY_REFUSE_FP16 = ('sar', )
DTYPES = {None: 'torch.float32', 'bf16': 'torch.bfloat16',
          'fp16': 'torch.float16'}


def build_options(method, request):
    """The tiny data and model of ``method``'s config (fixtures built only
    for the task that needs them)."""
    if is_classification(method):
        return request.getfixturevalue('cnn_checkpoint'), cls_options(
            method, request.getfixturevalue('cifar_stream'))
    cityscapes = request.getfixturevalue('tiny_cityscapes') \
        if method.startswith('eata') else None
    return request.getfixturevalue('confident_checkpoint'), seg_options(
        method, request.getfixturevalue('tiny_acdc'), cityscapes)


@pytest.mark.parametrize('device,precision', device_precisions())
@pytest.mark.parametrize('method', SEG_METHODS + CLS_METHODS)
def test_method_runs_finite_on_the_device(method, device, precision, request,
                                          tmp_path, monkeypatch,
                                          record_property):
    use_device(monkeypatch, device)
    checkpoint, opts = build_options(method, request)
    opts['test_cfg.mixed_precision'] = precision
    may_refuse = precision == 'fp16' and \
        method.split('-')[0] in MAY_REFUSE_FP16
    try:
        run = Run(config_of(method), checkpoint, tmp_path, opts)
    except ValueError as err:
        if not may_refuse:
            raise
        # the refusal names the precision and what to use instead
        assert "mixed_precision='fp16'" in str(err) and 'bf16' in str(err)
        assert not osp.exists(tmp_path / 'continual_results.json')
        record_property('fp16', f'refused: {err}')
        return
    if may_refuse:
        record_property('fp16', 'ran')

    with open(tmp_path / 'continual_results.json') as f:
        stages = json.load(f)['stages']
    conditions = list(CIFAR_NAMES) if is_classification(method) else \
        ['fog', 'night', 'rain', 'snow']
    assert [s['condition'] for s in stages] == conditions
    assert_finite_numbers(run.metrics)
    assert_finite_on(run.model, device)
    scalars = run.scalars()
    assert_finite_numbers(scalars)
    if precision is None:
        assert {str(d) for d in run.dtypes} == {'torch.float32'}
    else:  # the forward passes ran under autocast
        assert DTYPES[precision] in {str(d) for d in run.dtypes}
    if run.method.has_loss:
        assert run.method.num_updates > 0
        assert any(key.startswith('test/loss') for key in scalars)


@pytest.mark.cuda
@pytest.mark.parametrize('precision', [None, 'bf16'])
def test_tent_stag_replayed_as_a_cuda_graph(precision, request, tmp_path,
                                           monkeypatch):
    """tent-stag's config with the loop's ``test_cfg.cuda_graph=True``
    through the Runner: its steps replayed from captured graphs (captured
    again in every stage: one eager step, then a capture, on the tiny
    stream's 2 images a stage), the metrics of the eager run with the same
    optimizer (Adam, ``capturable=True``) within float32 rounding's flips
    of a few pixels."""
    use_device(monkeypatch, 'cuda')
    checkpoint, opts = build_options('tent-stag', request)
    opts['test_cfg.mixed_precision'] = precision
    eager = Run(config_of('tent-stag'), checkpoint, tmp_path / 'eager',
                dict(opts, **{'test_cfg.method.optimizer.capturable': True}))
    graphed = Run(config_of('tent-stag'), checkpoint, tmp_path / 'graph',
                  dict(opts, **{'test_cfg.cuda_graph': True,
                                'test_cfg.graph_warmup': 1}))
    graphs = graphed.runner.test_loop.graph_step
    assert graphs.graphs, graphs.eager_steps  # the last stage's capture
    assert graphed.method.num_updates == eager.method.num_updates
    assert_finite_on(graphed.model, 'cuda')
    for key, value in eager.metrics.items():
        if isinstance(value, float):
            assert graphed.metrics[key] == pytest.approx(value, abs=1.0), key
