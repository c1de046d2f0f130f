"""An option a method or the loop accepts and then ignores lets a config
say one thing while the run does another. This holds a static (``ast``)
check of the ``__init__`` of every registered method and its bases in the
package, ``OnlineAdaptationLoop``, ``SpeedOptions`` and ``STAGLoss``, and a
self-test planting unread options, to show the check can fail.

A parameter is read when ``__init__`` passes it to a call (``super().
__init__(x=x)``: the base's ``x`` is checked in turn) or computes with it,
or stores it into ``self.X`` (as is, via ``bool``/``dict``/``or``...) and
the package loads ``.X``. A raise guard alone means refused; it does not
make a stored option read."""
import ast
import dataclasses
import inspect
import os.path as osp
import textwrap
from pathlib import Path

import mmseg_stag

PACKAGE = Path(mmseg_stag.__file__).parent
#: calls that only convert a value on its way into an attribute
CONVERTERS = {'bool', 'int', 'float', 'str', 'dict', 'list', 'tuple', 'set'}


def loaded_attributes(trees):
    """Every ``obj.X`` the sources load, by ``X``."""
    return {node.attr for tree in trees for node in ast.walk(tree)
            if isinstance(node, ast.Attribute)
            and isinstance(node.ctx, ast.Load)}


def self_attrs(target, value, node):
    """The ``self.X`` names an assignment of ``value`` to ``target`` stores
    ``node`` into (tuples matched by position); None if not all ``self``."""
    if isinstance(target, ast.Tuple):
        if isinstance(value, ast.Tuple) and \
                len(value.elts) == len(target.elts):
            pairs = [(t, v) for t, v in zip(target.elts, value.elts)
                     if any(n is node for n in ast.walk(v))]
            return self_attrs(*pairs[0], node) if pairs else None
        parts = [self_attrs(t, value, node) for t in target.elts]
        return None if None in parts else set().union(*parts)
    if isinstance(target, ast.Attribute) and \
            isinstance(target.value, ast.Name) and target.value.id == 'self':
        return {target.attr}
    return None


def use_of(node, parents):
    """``('check', None)``, ``('store', {X...})`` or ``('read', None)``."""
    chain = [node]
    while chain[-1] in parents:
        chain.append(parents[chain[-1]])
    for child, parent in zip(chain, chain[1:]):
        if isinstance(parent, (ast.Raise, ast.Assert)) or (
                isinstance(parent, ast.If) and child is parent.test
                and isinstance(parent.body[-1], ast.Raise)):
            return 'check', None  # a guard or its message, first
    for child, parent in zip(chain, chain[1:]):
        if isinstance(parent, ast.Call) and child is not parent.func and \
                getattr(parent.func, 'id', None) not in CONVERTERS:
            return 'read', None  # handed to something that acts on it
        if isinstance(parent, (ast.Assign, ast.AnnAssign)):
            targets = getattr(parent, 'targets', None) or [parent.target]
            names = [self_attrs(t, parent.value, node) for t in targets]
            if None in names:
                return 'read', None  # into a local: computed with
            return 'store', set().union(*names)
        if isinstance(parent, (ast.stmt, ast.comprehension)):
            return 'read', None  # a condition, a loop, a return...
    return 'read', None


def unread_options(cls_node, loaded):
    """``[(param, lineno)]`` of ``cls_node``'s ``__init__`` options that
    reach nothing; ``loaded``: the attribute names the package loads."""
    if any('dataclass' in ast.unparse(d) for d in cls_node.decorator_list):
        return [(n.target.id, n.lineno) for n in cls_node.body
                if isinstance(n, ast.AnnAssign) and n.target.id not in loaded]
    (init, ) = [n for n in cls_node.body
                if isinstance(n, ast.FunctionDef) and n.name == '__init__']
    parents = {c: p for p in ast.walk(init) for c in ast.iter_child_nodes(p)}
    args = init.args.posonlyargs + init.args.args + init.args.kwonlyargs
    unread = []
    for arg in args[1:]:  # **kwargs (init.args.kwarg) is passed on, skipped
        uses = [use_of(n, parents) for n in ast.walk(init)
                if isinstance(n, ast.Name) and n.id == arg.arg
                and isinstance(n.ctx, ast.Load)]
        kinds = {kind for kind, _ in uses}
        stored = set().union(*[names for kind, names in uses
                               if kind == 'store'])
        if 'read' in kinds or stored & loaded or kinds == {'check'}:
            continue  # acts, is kept and read, or only refused
        unread.append((arg.arg, arg.lineno))
    return unread


def classes_to_check():
    """The registered methods and a task's own (segmentation CoTTA),
    their bases in the package, the loop, its speed options and the STAG
    loss."""
    import mmseg_stag.classification  # noqa: F401  (registers methods)
    import mmseg_stag.segmentation  # noqa: F401
    from mmseg_stag.core import METHODS
    from mmseg_stag.core.stag_loss import STAGLoss
    from mmseg_stag.engine.online_loop import OnlineAdaptationLoop
    from mmseg_stag.engine.speed_options import SpeedOptions
    from mmseg_stag.segmentation.online_task import OWN_METHODS
    roots = [OnlineAdaptationLoop, SpeedOptions, STAGLoss]
    roots += [*METHODS.module_dict.values(), *OWN_METHODS.values()]
    found = {}
    for klass in (k for root in roots for k in inspect.getmro(root)):
        in_package = (klass.__module__ or '').startswith('mmseg_stag')
        if in_package and ('__init__' in vars(klass)
                           or dataclasses.is_dataclass(klass)):
            found[f'{klass.__module__}.{klass.__qualname__}'] = klass
    return found


def test_every_option_of_a_method_or_the_loop_is_read():
    trees = [ast.parse(p.read_text(encoding='utf-8'))
             for p in sorted(PACKAGE.rglob('*.py'))]
    loaded = loaded_attributes(trees)
    unread = []
    for klass in classes_to_check().values():
        lines, start = inspect.getsourcelines(klass)
        cls_node = ast.parse(textwrap.dedent(''.join(lines))).body[0]
        path = osp.relpath(inspect.getsourcefile(klass), PACKAGE.parent)
        unread += [f'{klass.__name__}.{name} ({path}:{line + start - 1})'
                   for name, line in unread_options(cls_node, loaded)]
    assert not unread, (
        'accepted but never read: ' + ', '.join(unread) + '. Read each one '
        'where it should act, refuse it with a ValueError naming it, or '
        'remove it.')


#: ``dead`` is checked and stored, nothing loads ``self.dead``; ``ignored``
#: is never used; the other three act
PLANTED = '''
class Planted:
    def __init__(self, passed=1, kept=2, dead=3, refused=None, ignored=4,
                 **kwargs):
        if refused is not None:
            raise ValueError('refused does nothing yet')
        if dead < 0:
            raise ValueError('dead must be >= 0')
        self.model = build(passed)
        self.kept, self.dead = bool(kept), dead

    def run(self):
        return self.kept
'''


def test_the_checker_reports_the_planted_unread_option():
    tree = ast.parse(PLANTED)
    assert unread_options(tree.body[0], loaded_attributes([tree])) == [
        ('dead', 3), ('ignored', 3)]
