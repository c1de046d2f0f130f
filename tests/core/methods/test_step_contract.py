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
    found = {f'METHODS.{name}': cls
             for name, cls in METHODS.module_dict.items()}
    try:  # a task's own classes (segmentation CoTTA)
        from mmseg_stag.segmentation.online_task import OWN_METHODS
        found.update((f'segmentation.{name}', cls)
                     for name, cls in OWN_METHODS.items())
    except ImportError:  # no MMSeg: the core's methods
        pass
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
    from mmseg_stag.core.methods.base import UpdateCount
    assert issubclass(BaseMethod, UpdateCount)
    source = inspect.getsource(BaseMethod) + inspect.getsource(UpdateCount)
    assert source.count('self._t + updated') == 1  # count_update's
    assert source.count('self._num_updates + updated') == 1


@pytest.mark.parametrize('cfg,message', [
    (dict(type='tent', loss='entropy', align_corners=True),
     "align_corners=True resizes the logits of loss='pseudo_ce_fullres' "
     'only'),
    (dict(type='tent', stag=dict(beta0=1.0, gamma=1.0, type='FocalLoss')),
     r"stag.type='FocalLoss': a method's STAG term is STAGLoss"),
    (dict(type='cotta', restore_prob=0.0, restore_on_device=True),
     'restore_prob=0.0 restores nothing'),
])
def test_an_option_that_would_do_nothing_is_refused(cfg, message):
    from mmseg_stag.core import build_method
    with pytest.raises(ValueError, match=message):
        build_method(cfg)


def test_the_options_that_act_are_accepted():
    from mmseg_stag.core import build_method
    build_method(dict(type='tent', loss='pseudo_ce_fullres',
                      align_corners=True))
    build_method(dict(type='tent', stag=dict(beta0=1.0, gamma=1.0,
                                             type='STAGLoss')))
    build_method(dict(type='cotta', restore_prob=0.01,
                      restore_on_device=True))
