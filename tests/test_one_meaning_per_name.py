"""A module-level name of the package (a function, a class, a constant)
is defined in one of its files only: the same name in two files was two
meanings (``METRICS`` the registry and a table of scores; ``format_table``
of stages and of runs; ``markdown_table`` giving lines and a string;
``dotted``, ``plain``, ``COLUMNS``, ``CORRUPTIONS`` twice). A module
re-exporting a name imports it; it does not define it again."""
import ast
import os
import os.path as osp
from collections import defaultdict

REPO = osp.dirname(osp.dirname(osp.abspath(__file__)))
PACKAGE = osp.join(REPO, 'mmseg_stag')


def defined_names(path):
    """The names a module's top level binds by ``def``, ``class`` or an
    assignment (not by an import; dunder names left out)."""
    with open(path, encoding='utf-8') as f:
        tree = ast.parse(f.read())
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef,
                             ast.ClassDef)):
            yield node.name
        elif isinstance(node, ast.Assign):
            yield from (t.id for t in node.targets
                        if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target,
                                                            ast.Name):
            yield node.target.id


def test_no_name_is_defined_in_two_files_of_the_package():
    where = defaultdict(list)
    for folder, _, files in os.walk(PACKAGE):
        for name in sorted(files):
            if name.endswith('.py'):
                path = osp.join(folder, name)
                for defined in set(defined_names(path)):
                    if not defined.startswith('__'):
                        where[defined].append(osp.relpath(path, REPO))
    twice = {name: paths for name, paths in where.items() if len(paths) > 1}
    assert not twice, twice
