"""One step contract: a method implements ``forward_and_adapt(batch,
beta)`` and nothing else of the step. ``BaseMethod.adapt`` alone runs it
(or the CUDA graph replaying it), counts it and returns its statistics, so
the loop calls one thing for every method."""
import inspect

import pytest

import mmseg_stag  # noqa: F401  (registers every method)
from mmseg_stag.core import METHODS
from mmseg_stag.core.methods.base import BaseMethod

#: what belongs to the step and is BaseMethod's alone
STEP = ('adapt', 'update')


def registered_methods():
    found = {}
    registries = [METHODS]
    try:
        from mmseg_stag.segmentation.registry import SEG_METHODS
        registries.append(SEG_METHODS)
    except ImportError:  # no MMSeg: the core's methods
        pass
    for registry in registries:
        for name, cls in registry.module_dict.items():
            found[f'{registry.name}.{name}'] = cls
    return found


@pytest.mark.parametrize('name,cls', sorted(registered_methods().items()))
def test_a_method_overrides_only_forward_and_adapt(name, cls):
    for klass in inspect.getmro(cls):
        if klass is BaseMethod:
            break
        for attr in STEP:
            assert attr not in vars(klass), (
                f'{name} ({klass.__name__}) overrides {attr}: implement '
                'forward_and_adapt(batch, beta) instead; BaseMethod.adapt '
                'runs and counts the step')


def test_base_method_has_no_second_counter():
    assert not hasattr(BaseMethod, 'update')
    source = inspect.getsource(BaseMethod)
    assert source.count('self.step += 1') == 1
