"""The ``mmseg_stag`` scope has a registry where a run names something,
and only there: each child of an MMEngine root in ``mmseg_stag.registry``
holds our classes or is one that a shipped config's run builds from (with
``default_scope='mmseg_stag'``, the classification configs', MMEngine
looks for the scope's child, and warns where it finds none), and every
root such a run builds from has one. Measured on a tiny run of a real
classification config (the segmentation configs run in MMSeg's scope)."""
from cls_helpers import CIFAR, options, run
from mmengine.registry import Registry

import mmseg_stag.registry as scope


def test_the_scope_has_a_registry_where_a_run_names_one(
        tmp_path, stream, names, checkpoint, monkeypatch):
    switched = set()  # the registries built from
    switch = Registry.switch_scope_and_registry

    def spy(registry, scope_name):
        switched.add(registry)
        return switch(registry, scope_name)

    monkeypatch.setattr(Registry, 'switch_scope_and_registry', spy)
    run(CIFAR.format('tent-stag'), checkpoint, tmp_path / 'cls',
        options(stream[1], names))
    # MMEngine's roots built from (ours are roots of the scope itself)
    roots = {r for r in switched
             if r.parent is None and r.scope != 'mmseg_stag'}
    children = [r for r in vars(scope).values() if isinstance(r, Registry)
                and r.scope == 'mmseg_stag' and r.parent is not None
                and r.parent.parent is None]
    unused = [c.name for c in children
              if not c.module_dict and c.parent not in roots]
    assert not unused, f'children no run builds from: {unused}'
    lacking = roots - {c.parent for c in children}
    assert not lacking, 'roots a run builds from without a child in the ' \
        f'scope: {sorted(r.name for r in lacking)}'
