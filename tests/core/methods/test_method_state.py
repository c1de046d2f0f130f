"""``state_dict``/``load_state_dict`` of every method: a stream stopped
after some batches, saved with ``torch.save``, read back with
``weights_only=True`` into a fresh method configured on the source model
(and the random states restored), continues exactly as the uninterrupted
stream: same predictions, same parameters, same state of every attribute."""
import inspect
import io

import pytest
import torch
import torch.nn as nn
from reference.adaptation_testbed import (CNN_ADAPTER, adapt, block_images,
                                          make_cnn)

from mmseg_stag.core import Batch, build_method
from mmseg_stag.engine.run_state import rng_state, set_rng_state

STAG = dict(beta0=50.0, gamma=5.0)
SGD = dict(type='SGD', lr=0.05, momentum=0.9)
METHODS = {
    'tent+stag': dict(type='tent', optimizer=SGD, stag=STAG,
                      stage_restart=('optimizer', )),
    'bn_adapt+stag': dict(type='bn_adapt', optimizer=SGD, stag=STAG,
                          stage_restart=('beta_t', )),
    'eata+stag': dict(type='eata', optimizer=SGD, stag=STAG,
                      fisher_alpha=50.0, entropy_margin=0.9, d_margin=0.5),
    'sar+stag': dict(type='sar', optimizer=SGD, stag=STAG,
                     entropy_margin=0.9, recovery_threshold=2.0),
    'deyo+stag': dict(type='deyo', optimizer=SGD, stag=STAG,
                      reweight_margin=0.9, plpd_threshold=0.0),
    'cotta+stag': dict(type='cotta', optimizer=SGD, stag=STAG,
                       restore_prob=0.3, ap=0.5, num_augs=2),
}
BATCHES = [block_images(seed, n=8) for seed in range(6)]
STOP = 3  # the stream is stopped before batch 3 (stage 1's second batch)


def start(cfg):
    """A fresh method configured on the source model (and its Fisher
    information, for EATA, from clean batches)."""
    model = make_cnn(scale=10)
    method = build_method(cfg)
    method.configure(model, CNN_ADAPTER)
    if method.needs_source_data:
        method.fit_source([Batch(block_images(100 + i, n=8))
                           for i in range(2)])
    return method


def stream(method, batches, first=0):
    """Predict-then-adapt on ``batches`` (two batches per stage)."""
    predictions = []
    for i, x in enumerate(batches, first):
        method.start_stage(i // 2)
        predictions.append(adapt(method, x)[0])
    return predictions


def assert_same(a, b, where='method'):
    """Same state: modules by their state dicts, optimizers by theirs,
    tensors exactly, containers and plain objects recursively."""
    if isinstance(a, nn.Module):
        assert isinstance(b, nn.Module), where
        assert_same(a.state_dict(), b.state_dict(), where)
    elif isinstance(a, torch.optim.Optimizer):
        assert_same(a.state_dict(), b.state_dict(), where)
    elif isinstance(a, torch.Tensor):
        assert torch.equal(a, b), where
    elif isinstance(a, dict):
        assert list(a) == list(b), where
        for key in a:
            assert_same(a[key], b[key], f'{where}[{key!r}]')
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f'{where}[{i}]')
    elif hasattr(a, '__dict__') and not inspect.isroutine(a):
        assert_same(vars(a), vars(b), where)
    else:
        assert a == b, f'{where}: {a!r} != {b!r}'


@pytest.mark.parametrize('name', list(METHODS))
def test_resumed_stream_equals_uninterrupted(name):
    torch.manual_seed(7)
    whole = start(METHODS[name])
    expected = stream(whole, BATCHES)

    torch.manual_seed(7)
    first = start(METHODS[name])
    before = stream(first, BATCHES[:STOP])
    saved = io.BytesIO()
    torch.save(dict(method=first.state_dict(), rng=rng_state()), saved)
    del first
    torch.manual_seed(12345)  # whatever happens in between
    saved.seek(0)
    state = torch.load(saved, weights_only=True)

    resumed = build_method(METHODS[name])
    model = make_cnn(scale=10)
    resumed.configure(model, CNN_ADAPTER)  # no fit_source
    resumed.load_state_dict(state['method'])
    set_rng_state(state['rng'])
    after = stream(resumed, BATCHES[STOP:], first=STOP)

    for i, (x, y) in enumerate(zip(expected, before + after)):
        assert torch.equal(x, y), f'batch {i}'
    assert_same(vars(whole), vars(resumed))
    assert whole.num_updates > STOP  # the stream did adapt


def to_dtype(state, dtype):
    """``state`` with every floating tensor in ``dtype``."""
    if isinstance(state, torch.Tensor):
        return state.to(dtype) if state.is_floating_point() else state
    if isinstance(state, dict):
        return {k: to_dtype(v, dtype) for k, v in state.items()}
    if isinstance(state, (list, tuple)):
        return type(state)(to_dtype(v, dtype) for v in state)
    return state


def floating_tensors(obj, where='method', seen=None):
    """``(where, tensor)`` of every floating tensor the method holds."""
    seen = set() if seen is None else seen
    if id(obj) in seen:
        return
    seen.add(id(obj))
    if isinstance(obj, torch.Tensor):
        if obj.is_floating_point():
            yield where, obj
    elif isinstance(obj, (nn.Module, torch.optim.Optimizer)):
        yield from floating_tensors(obj.state_dict(), where, seen)
    elif isinstance(obj, dict):
        for key, value in obj.items():
            yield from floating_tensors(value, f'{where}[{key!r}]', seen)
    elif isinstance(obj, (list, tuple)):
        for i, value in enumerate(obj):
            yield from floating_tensors(value, f'{where}[{i}]', seen)
    elif hasattr(obj, '__dict__') and not inspect.isroutine(obj):
        yield from floating_tensors(vars(obj), where, seen)


@pytest.mark.parametrize('name', list(METHODS))
def test_restored_state_goes_to_the_parameters_device_and_dtype(name):
    """A state read from a file whose tensors are elsewhere (a GPU run's
    state is read onto the CPU; here: float32 for a float64 model, the
    same ``.to(parameter)`` path) lands on the parameters' device and
    dtype: nothing the next step uses stays behind."""
    first = start(METHODS[name])
    stream(first, BATCHES[:STOP])
    state = to_dtype(first.state_dict(), torch.float32)
    resumed = build_method(METHODS[name])
    model = make_cnn(scale=10)
    resumed.configure(model, CNN_ADAPTER)
    resumed.load_state_dict(state)
    held = list(floating_tensors(vars(resumed)))
    assert held
    for where, tensor in held:
        assert (tensor.device, tensor.dtype) == (
            torch.device('cpu'), torch.float64), where
    stream(resumed, BATCHES[STOP:], first=STOP)  # and it runs


def test_state_holds_only_what_steps_change():
    """The run state keeps the adapted parameters and the buffers, not
    the frozen weights (the checkpoint's, which the run's identity pins)."""
    method = start(METHODS['tent+stag'])
    model_state = method.state_dict()['model']
    adapted = {n for n, _ in method.params}
    buffers = {n for n, _ in method.model.named_buffers()}
    assert set(model_state) == adapted | buffers
    assert adapted < {n for n, _ in method.model.named_parameters()}
    other = build_method(METHODS['tent+stag'])
    model = make_cnn(scale=10)
    other.configure(model, CNN_ADAPTER)
    del model_state[sorted(adapted)[0]]
    with pytest.raises(ValueError, match='holds other tensors'):
        other.load_state_dict(dict(method.state_dict(), model=model_state))


def test_state_dict_needs_configure():
    method = build_method(dict(type='tent'))
    with pytest.raises(RuntimeError, match='configure before state_dict'):
        method.state_dict()


def test_sar_recoveries_fire_in_this_stream():
    """The SAR case above exercises recovery (its EMA and counters)."""
    method = start(METHODS['sar+stag'])
    stream(method, BATCHES)
    assert method.num_recoveries > 0 and method.ema is not None


@pytest.mark.parametrize('opt', [
    dict(type='Adam', lr=1e-2), dict(type='AdamW', lr=1e-2, amsgrad=True),
    dict(type='SGD', lr=0.05, momentum=0.9),
    dict(type='SGD', lr=0.05, momentum=0.9, nesterov=True,
         weight_decay=1e-3),
    dict(type='SGD', lr=0.05, momentum=0.9, dampening=0.5),
    dict(type='Adagrad', lr=1e-2)], ids=lambda o: '-'.join(
        f'{v}' for v in o.values()))
def test_a_stage_restart_of_the_optimizer_steps_as_a_new_one(opt):
    """``stage_restart=('optimizer',)`` zeroes the state in place where a
    new optimizer's state starts at zero (Adam, AdamW, SGD without
    dampening: the same object, so a CUDA graph stepping it survives),
    else builds a new one; either way the next stage's updates are those
    of a new optimizer, bit for bit."""
    from mmseg_stag.core.methods.method_state import restart_in_place
    torch.manual_seed(0)
    restarted = start(dict(type='tent', optimizer=opt,
                           stage_restart=('optimizer', )))
    torch.manual_seed(0)
    fresh = start(dict(type='tent', optimizer=opt))  # rebuilt by hand
    first = restarted.optimizer
    for i in range(8):
        x = block_images(i, n=8)
        restarted.start_stage(i // 3)
        if i and i % 3 == 0:
            fresh.optimizer = fresh.build_optimizer()
        want, got = adapt(fresh, x)[0], adapt(restarted, x)[0]
        assert torch.equal(got, want), i
    in_place = opt['type'] in ('Adam', 'AdamW') or (
        opt['type'] == 'SGD' and not opt.get('dampening'))
    assert (restarted.optimizer is first) == in_place
    assert_same(restarted.model, fresh.model)
    assert_same(restarted.optimizer, fresh.optimizer)
    assert restart_in_place(restarted.optimizer) == in_place
