"""Scripts under ``tools/`` import the package, never each other (what
several tools share lives in the package; docs/layout.md, "Where code
lives"); a test of a tool's own logic loads the script by its path."""
import ast
import glob
import os.path as osp

REPO = osp.dirname(osp.dirname(osp.abspath(__file__)))
TOOL_NAMES = {osp.splitext(osp.basename(p))[0]
              for p in glob.glob(osp.join(REPO, 'tools', '*.py'))}


def imported(path):
    with open(path, encoding='utf-8') as f:
        tree = ast.parse(f.read())
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            yield node.module


def test_a_tool_imports_no_other_tool():
    bad = [(osp.basename(p), m) for p in glob.glob(
        osp.join(REPO, 'tools', '*.py')) for m in imported(p)
        if m.split('.')[0] in TOOL_NAMES or m.startswith('tools')]
    assert not bad, bad


def test_no_test_imports_a_tool_as_a_module():
    bad = [(osp.relpath(p, REPO), m) for p in glob.glob(
        osp.join(REPO, 'tests', '**', '*.py'), recursive=True)
        for m in imported(p) if m == 'tools' or m.startswith('tools.')]
    assert not bad, bad
