"""The package's layers: every import of ``mmseg_stag`` code goes down,
never up or sideways, so there is no import cycle between its parts.

    core, checkpoint                                 (no import of ours)
    registry                                         (the scope's registries)
    engine                                           (loop, stream, reports)
    classification, segmentation                     (the two tasks)
    paper, apis                                      (the paper's facts and
                                                      tables; adapting on
                                                      own frames)
    mmseg_stag/__init__.py                           (imports the parts)

A function may import the package itself (``import mmseg_stag`` registers
every part, as a config's ``custom_imports`` does). The measuring harness,
``benchmarks/``, sits beside the package and is not installed: no module
of the package imports it."""
import ast
import os
import os.path as osp

REPO = osp.dirname(osp.dirname(osp.abspath(__file__)))
PACKAGE = osp.join(REPO, 'mmseg_stag')
LAYERS = dict(versions=0, core=0, checkpoint=0,
              registry=1, engine=2, classification=3, segmentation=3,
              paper=4, apis=4, mmseg_stag=5)


def part_of(module):
    """``mmseg_stag.engine.report`` -> ``engine``."""
    parts = module.split('.')
    return parts[1] if len(parts) > 1 else parts[0]


def imports(path, module, package):
    """``(target module, line, inside a function)`` of each import."""
    tree = ast.parse(open(path).read())
    functions = {id(n) for f in ast.walk(tree)
                 if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
                 for n in ast.walk(f)}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split('.')[:len(package.split('.')) -
                                            node.level + 1]
                targets = ['.'.join(base + ([node.module] if node.module
                                            else []))]
            else:
                targets = [node.module or '']
        elif isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        else:
            continue
        for target in targets:
            if target.split('.')[0] in ('mmseg_stag', 'benchmarks'):
                yield target, node.lineno, id(node) in functions


def test_every_import_goes_down_a_layer():
    wrong = []
    for folder, _, files in os.walk(PACKAGE):
        for name in files:
            if not name.endswith('.py'):
                continue
            path = osp.join(folder, name)
            module = osp.relpath(path, REPO)[:-3].replace(
                os.sep, '.').removesuffix('.__init__')
            package = module if name == '__init__.py' else \
                module.rsplit('.', 1)[0]
            source = part_of(module)
            assert source in LAYERS, f'{path}: add its part to LAYERS'
            for target, line, in_function in imports(path, module, package):
                if target.split('.')[0] == 'benchmarks':
                    wrong.append(f'{osp.relpath(path, REPO)}:{line}: '
                                 f'{source} imports {target} (not installed)')
                    continue
                part = part_of(target)
                if part == source or (in_function and target ==
                                      'mmseg_stag'):
                    continue
                if LAYERS[part] >= LAYERS[source]:
                    wrong.append(f'{osp.relpath(path, REPO)}:{line}: '
                                 f'{source} imports {target}')
    assert not wrong, '\n'.join(wrong)
