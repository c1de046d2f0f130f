"""TENT reads in at most ten files: ``mmseg_stag/core/methods/tent.py`` and
every package module it imports, transitively, at module level (top-level
``import`` and ``from`` statements, relative ones resolved; ``from ..x
import y`` counts ``x``, and ``x.y`` where that is a module file), package
``__init__.py`` files left out. A maintainer follows TENT end to end from
its file, through the base class, the loss and what a step takes and
gives; the authors' tent.py is one file of about 100 lines, so the
plugin's TENT should not send its reader through many more."""
import ast
import os.path as osp

REPO = osp.dirname(osp.dirname(osp.abspath(__file__)))
TENT = osp.join('mmseg_stag', 'core', 'methods', 'tent.py')
LIMIT = 10


def module_file(name):
    """The file of module ``name`` (dotted), or None: a package (its
    ``__init__.py``) is neither counted nor followed."""
    path = osp.join(*name.split('.')) + '.py'
    return path if osp.isfile(osp.join(REPO, path)) else None


def imported_files(path):
    """The package files ``path``'s top-level imports name."""
    parts = path[:-len('.py')].split(osp.sep)
    package = parts[:-1]
    with open(osp.join(REPO, path), encoding='utf-8') as f:
        tree = ast.parse(f.read())
    names = []
    for node in tree.body:
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level \
                else []
            module = '.'.join(base + ([node.module] if node.module else []))
            names += [module] + [f'{module}.{a.name}' for a in node.names]
    found = {module_file(n) for n in names if n.startswith('mmseg_stag')}
    return found - {None}


def tent_files():
    """tent.py and its transitive top-level package imports, no
    ``__init__.py``, each with its number of lines."""
    seen, todo = set(), [TENT]
    while todo:
        path = todo.pop()
        if path not in seen:
            seen.add(path)
            todo += imported_files(path)
    return {p: sum(1 for _ in open(osp.join(REPO, p), encoding='utf-8'))
            for p in sorted(seen)}


def test_tent_reads_in_at_most_ten_files():
    files = tent_files()
    listing = '\n'.join(f'{n:5d} {p}' for p, n in files.items())
    print(f'{len(files)} files:\n{listing}')
    assert len(files) <= LIMIT, (
        f'TENT reads in {len(files)} files (at most {LIMIT}):\n{listing}')
