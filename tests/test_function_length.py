"""Every function of the package reads on one screen: at most 60 lines,
its docstring included (a longer one is split where its parts have names)."""
import ast
import os
import os.path as osp

REPO = osp.dirname(osp.dirname(osp.abspath(__file__)))
LIMIT = 60


def test_no_function_of_the_package_is_over_sixty_lines():
    longer = []
    for root, _, names in os.walk(osp.join(REPO, 'mmseg_stag')):
        for name in names:
            if not name.endswith('.py'):
                continue
            path = osp.join(root, name)
            with open(path, encoding='utf-8') as f:
                tree = ast.parse(f.read())
            longer += [
                f'{osp.relpath(path, REPO)}:{node.lineno} {node.name} '
                f'({node.end_lineno - node.lineno + 1} lines)'
                for node in ast.walk(tree)
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
                and node.end_lineno - node.lineno + 1 > LIMIT]
    assert not longer, longer


def test_base_method_reads_in_one_sitting():
    """``BaseMethod`` (the life cycle and the step every method shares)
    stays at most 250 lines; what a resume saves is ``MethodState``'s."""
    path = osp.join(REPO, 'mmseg_stag', 'core', 'methods', 'base.py')
    with open(path, encoding='utf-8') as f:
        tree = ast.parse(f.read())
    (cls, ) = [n for n in tree.body if isinstance(n, ast.ClassDef)
               and n.name == 'BaseMethod']
    assert cls.end_lineno - cls.lineno + 1 <= 250
