"""The README and the docs say what runs: every shell/Python block is run
as written, unless the line before it says why not
(``<!-- not run: needs real data -->``); every block is checked for paths
that exist, tools' options that exist, ``make`` targets and
``--cfg-options`` keys of the config it names. The generated pages come
from the repository (``tools/docs_hooks.py``); the README stays short."""
import functools
import glob
import importlib.util
import json
import os
import os.path as osp
import re
import shlex
import subprocess
import sys
import textwrap

import pytest

REPO = osp.dirname(osp.dirname(osp.abspath(__file__)))
PAGES = [osp.join(REPO, 'README.md')] + sorted(
    glob.glob(osp.join(REPO, 'docs', '*.md')))
FENCE = re.compile(r'^([ \t]*)```(\w*)\n(.*?)^[ \t]*```', re.S | re.M)
NOT_RUN = re.compile(r'<!-- not run: ([^>]+?) -->\s*$')


def blocks():
    """``(page, line, language, code, reason not run or None)``."""
    found = []
    for page in PAGES:
        with open(page, encoding='utf-8') as f:
            text = f.read()
        for match in FENCE.finditer(text):
            lang = match.group(2) or 'text'
            if lang not in ('bash', 'sh', 'python'):
                continue
            before = text[:match.start()].rstrip('\n').rsplit('\n', 1)[-1]
            reason = NOT_RUN.search(before)
            line = text.count('\n', 0, match.start()) + 1
            code = textwrap.dedent(match.group(3))
            found.append((osp.relpath(page, REPO), line, lang, code,
                          reason and reason.group(1)))
    return found


BLOCKS = blocks()
RUN = [b for b in BLOCKS if b[4] is None]
SHELL = [b for b in BLOCKS if b[2] in ('bash', 'sh')]


def block_id(block):
    return f'{block[0]}:{block[1]}'


def commands(code):
    """The block's commands: continuation lines joined, comments dropped,
    a ``for VAR in WORDS; do ... done`` loop unrolled."""
    joined = re.sub(r'\\\n\s*', ' ', code)
    loop = re.search(r'for (\w+) in ([^;]+); do(.*?)done', joined, re.S)
    if loop:
        body = loop.group(3)
        joined = joined[:loop.start()] + '\n'.join(
            body.replace('$' + loop.group(1), value)
            for value in loop.group(2).split()) + joined[loop.end():]
    out = []
    for line in joined.splitlines():
        line = line.split(' #')[0].strip()
        if line and not line.startswith('#'):
            out.extend(part.strip() for part in re.split(r'&&|;|\|', line))
    return [c for c in out if c]


#: prints ``{tool: its --help output}`` for the tools in ``argv``: each
#: tool run as ``python TOOL --help`` would, in one Python (torch imported
#: once, not once per tool)
HELP_ALL = r"""
import contextlib, io, json, runpy, sys
out = {}
for tool in sys.argv[1:]:
    sys.argv = [tool, '--help']
    text = io.StringIO()
    code = 0
    with contextlib.redirect_stdout(text):
        try:
            runpy.run_path(tool, run_name='__main__')
        except SystemExit as done:
            code = done.code or 0
    out[tool] = [code, text.getvalue()]
sys.stdout.write(json.dumps(out))
"""


def shell_tools():
    """Every ``tools/*.py`` a shell block runs with ``python``."""
    found = set()
    for _, _, _, code, _ in SHELL:
        for command in commands(code):
            words = shlex.split(command.replace('$', 'DOLLAR'))
            tools = [w for w in words if re.match(r'^tools/[\w/]+\.py$', w)]
            if words and words[0].endswith('python') and tools:
                found.add(tools[0])
    return sorted(found)


@functools.lru_cache(maxsize=None)
def tools_help():
    """``{tool: (exit code, --help output)}`` of :func:`shell_tools`."""
    done = subprocess.run([sys.executable, '-c', HELP_ALL, *shell_tools()],
                          cwd=REPO, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


def tool_options(tool):
    """The ``--options`` in a tool's ``--help``."""
    code, text = tools_help()[tool]
    assert code == 0, f'{tool} --help exited with {code}'
    return set(re.findall(r'(--[\w-]+)', text)) | {'--help'}


def make_targets():
    with open(osp.join(REPO, 'Makefile'), encoding='utf-8') as f:
        return set(re.findall(r'^([\w-]+):', f.read(), re.M))


def cfg_keys_exist(config, pairs):
    """``--cfg-options`` keys that the config does not have."""
    from mmengine.config import Config
    cfg = Config.fromfile(osp.join(REPO, config))
    missing = []
    for pair in pairs:
        node = cfg
        for key in pair.split('=')[0].split('.'):
            if not hasattr(node, 'get') or key not in node:
                missing.append(pair)
                break
            node = node[key]
    return missing


@pytest.mark.parametrize('block', SHELL, ids=block_id)
def test_shell_block_names_what_exists(block):
    page, line, _, code, _ = block
    targets = make_targets()
    for command in commands(code):
        words = shlex.split(command.replace('$', 'DOLLAR'))
        paths = [w for w in words
                 if re.match(r'^(configs|tools)/[\w/.-]+$', w)]
        for path in paths:
            assert osp.exists(osp.join(REPO, path)), (page, line, path)
        if words[:1] == ['make'] and len(words) > 1 and '=' not in words[1]:
            assert words[1] in targets, (page, line, command)
        tools = [w for w in words if re.match(r'^tools/[\w/]+\.py$', w)]
        if words and words[0].endswith('python') and tools:
            known = tool_options(tools[0])
            for word in words:
                if word.startswith('--') and '=' not in word:
                    assert word in known, (page, line, tools[0], word)
            config = next((w for w in paths if w.endswith('.py')
                           and w.startswith('configs/')), None)
            if config and '--cfg-options' in words:
                pairs = [w for w in words[words.index('--cfg-options') + 1:]
                         if '=' in w and not w.startswith('-')]
                assert not cfg_keys_exist(config, pairs), (page, line)


@pytest.mark.parametrize('block', RUN, ids=block_id)
def test_block_runs_as_written(block, tmp_path):
    page, line, lang, code, _ = block
    env = dict(os.environ, PATH=osp.dirname(sys.executable) + os.pathsep +
               os.environ['PATH'], MPLBACKEND='Agg')
    argv = [sys.executable, '-c', code] if lang == 'python' else \
        ['bash', '-euo', 'pipefail', '-c', code]
    done = subprocess.run(argv, cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, f'{page}:{line}\n{done.stdout}\n{done.stderr}'


def test_every_block_not_run_says_why():
    for page, line, _, _, reason in BLOCKS:
        assert reason is None or len(reason.strip()) > 5, (page, line)


def hooks():
    spec = importlib.util.spec_from_file_location(
        'docs_hooks', osp.join(REPO, 'tools', 'docs_hooks.py'))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_beta_gamma_page_is_generated_not_copied():
    from mmseg_stag.paper.hparams import (our_hparams_markdown,
                                          paper_hparams_markdown)
    page = hooks().beta_gamma_page()
    assert paper_hparams_markdown() in page and our_hparams_markdown() in page
    for path in PAGES:  # nobody keeps a hand copy that could drift
        with open(path, encoding='utf-8') as f:
            assert paper_hparams_markdown() not in f.read(), path


def test_configs_page_lists_every_config():
    page = hooks().configs_page()
    for path in glob.glob(osp.join(REPO, 'configs', '**', '*.py'),
                          recursive=True):
        assert f'`{osp.basename(path)}`' in page, path


def test_support_matrix_lists_every_benchmark_config():
    module = hooks()
    page = module.support_matrix_page()
    demo = {'configs/demo', 'configs/cls/demo'}  # stand-ins: configs.md
    for path in glob.glob(osp.join(REPO, 'configs', '**', '*.py'),
                          recursive=True):
        folder = osp.relpath(osp.dirname(path), REPO)
        if '_base_' in folder or folder in demo:
            continue
        assert folder in module.MATRIX_FOLDERS, folder
        assert f'`{osp.basename(path)}`' in page, path
    # every paper score is in it, and each +STAG config's beta0/gamma
    from mmseg_stag.paper.results import PAPER_RESULTS
    for *_, plain, stag in PAPER_RESULTS:
        assert f'{plain:.1f}' in page
    # a paper baseline without a +STAG row: its config, no +STAG config
    assert ('| TENT | resnet50-gn | `imagenet-c_mild_resnet50-gn_tent.py` | '
            '– |  | 24.9 |') in page
    assert ('`imagenet-c_bs1_vit-b16_sar-stag.py` | 1000 / 10000 (paper) | '
            '56.6 → 65.5 |') in page
    assert '| 500 / 35 (ours) | – → – |' in page


def test_readme_is_short_and_links_every_page():
    with open(osp.join(REPO, 'README.md'), encoding='utf-8') as f:
        readme = f.read()
    assert readme.count('\n') <= 200
    for page in glob.glob(osp.join(REPO, 'docs', '*.md')):
        name = osp.basename(page)
        assert f'docs/{name}' in readme or name == 'index.md', name


def prose_share(root):
    """Docstring and comment lines over the non-blank lines of ``root``."""
    import ast
    import io
    import tokenize
    prose = total = 0
    for path in glob.glob(osp.join(root, '**', '*.py'), recursive=True):
        with open(path, encoding='utf-8') as f:
            source = f.read()
        lines = source.splitlines()
        marked = {t.start[0] for t in tokenize.generate_tokens(
            io.StringIO(source).readline) if t.type == tokenize.COMMENT}
        for node in ast.walk(ast.parse(source)):
            body = getattr(node, 'body', None)
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef,
                                 ast.AsyncFunctionDef)) and body and \
                    isinstance(body[0], ast.Expr) and \
                    isinstance(body[0].value, ast.Constant) and \
                    isinstance(body[0].value.value, str):
                marked.update(range(body[0].lineno, body[0].end_lineno + 1))
        total += sum(1 for line in lines if line.strip())
        prose += sum(1 for i in marked if lines[i - 1].strip())
    return prose / total


def test_package_says_what_it_does_briefly():
    """Docstrings and comments stay 15-25 % of the package (the narrative
    lives in docs/)."""
    assert 0.15 <= prose_share(osp.join(REPO, 'mmseg_stag')) <= 0.25


LINK = re.compile(r'\]\(([^)\s]+)\)')
CODE_PATH = re.compile(
    r'`((?:mmseg_stag|tools|configs|tests|demo_data|docs|\.ci)/[^`\s<>*]*)`')


def expand_braces(path):
    """``a_{x,y}.py`` -> ``a_x.py``, ``a_y.py``."""
    match = re.search(r'\{([^{}]*)\}', path)
    if not match:
        return [path]
    return [p for alt in match.group(1).split(',') for p in expand_braces(
        path[:match.start()] + alt + path[match.end():])]


GENERATED = ('beta-gamma.md', 'configs.md', 'support-matrix.md')
#: paths of the authors' code that the docs quote: CoTTA's ACDC fork's
#: entry points (acdc-protocol.md)
AUTHORS_PATHS = {'tools/cotta.py', 'tools/tent.py'}


def test_every_repository_path_in_the_docs_exists():
    """Every relative link, and every quoted repository path of the user
    pages (the changelog's are history), names a file that exists."""
    changelog = osp.join(REPO, 'CHANGELOG.md')
    missing = []
    for page in PAGES + [changelog]:
        with open(page, encoding='utf-8') as f:
            text = f.read()
        for target in LINK.findall(text):
            path = target.split('#')[0]
            if re.match(r'^(https?:|mailto:)', target) or not path or \
                    osp.basename(path) in GENERATED:
                continue
            if not osp.exists(osp.join(osp.dirname(page), path)):
                missing.append((osp.relpath(page, REPO), target))
        for quoted in CODE_PATH.findall(text) if page != changelog else []:
            for path in expand_braces(quoted.split('::')[0].rstrip('.,:')):
                if path not in AUTHORS_PATHS and \
                        osp.basename(path) not in GENERATED and \
                        not osp.exists(osp.join(REPO, path)):
                    missing.append((osp.relpath(page, REPO), quoted))
    assert not missing, missing


def test_reproduce_page_counts_the_configs_of_each_table():
    """docs/reproduce.md's list of the paper's tables: each row's config
    pattern matches as many shipped configs as its "runs" column says."""
    with open(osp.join(REPO, 'docs', 'reproduce.md'), encoding='utf-8') as f:
        rows = [line for line in f if line.startswith('| Table')]
    counted = 0
    for row in rows:
        cells = [c.strip() for c in row.strip().strip('|').split('|')]
        pattern, runs = cells[2].strip('`'), cells[3]
        if not pattern.startswith('configs/'):
            continue
        braces = re.search(r'\{([^}]+)\}', pattern)
        patterns = [pattern.replace(braces.group(0), part) for part in
                    braces.group(1).split(',')] if braces else [pattern]
        found = sum(len(glob.glob(osp.join(REPO, p))) for p in patterns)
        assert found == int(runs), (pattern, found, runs)
        counted += 1
    assert counted == 5


def report_figures():
    """Every ``(value, unit)`` the recorded reports' pages hold
    (docs/results/**/*.md, as the GPU runs wrote them): table cells under a
    header naming the unit, and numbers written with their unit."""
    units = ((r'\bms\b', 'ms'), (r'images/s', 'images/s'), (r'\bGB\b', 'GB'),
             (r'\bMB\b', 'MB'), (r'\((?:s|seconds)\)|\bs\b', 's'))

    def unit_of(text):
        return next((u for pattern, u in units if re.search(pattern, text)),
                    None)

    figures = set()
    for path in glob.glob(osp.join(REPO, 'docs', 'results', '**', '*.md'),
                          recursive=True):
        with open(path, encoding='utf-8') as f:
            lines = f.read().replace(',', '').split('\n')
        header = None
        for line in lines:
            for m in re.finditer(r'(?<![\w.])(\d+(?:\.\d+)?)\s?(ms|images/s|'
                                 r'MB|GB|s|min)\b', line):
                figures.add((float(m.group(1)), m.group(2)))
            if not line.startswith('|'):
                header = None
                continue
            cells = [c.strip() for c in line.strip().strip('|').split('|')]
            if header is None:
                header = [unit_of(c) for c in cells]
                continue
            for unit, cell in zip(header, cells):
                if unit:
                    figures.update((float(v), unit) for v in re.findall(
                        r'(?<![\w.])(\d+(?:\.\d+)?)', cell))
    return figures


def page_paragraphs():
    """``(page, first line, section title, paragraph)`` of the README and
    every page under docs/ (a table is one paragraph)."""
    pages = glob.glob(osp.join(REPO, 'docs', '*.md')) + [
        osp.join(REPO, 'README.md')]
    for page in pages:
        with open(page, encoding='utf-8') as f:
            text = f.read()
        section, start = '', 1
        for block in re.split(r'\n\s*\n', text):
            if block.startswith('#'):
                section = block.split('\n')[0]
            yield osp.relpath(page, REPO), start, section, block
            start += block.count('\n') + 2


#: a GPU speed or memory figure in a page: a number (or a range), its unit
FIGURE = re.compile(r'(?<![\w.–-])(\d[\d,]*(?:\.\d+)?)(?:–(\d[\d,]*'
                    r'(?:\.\d+)?))?\s?(ms|images/s|GB)\b')
#: where a page speaks of GPU runs (its paragraph or its section's title)
GPU_CONTEXT = re.compile(r'H100|GPU|CUDA|preset')


def test_pages_state_only_gpu_figures_the_reports_hold():
    """Where a page speaks of GPU runs, each step time (ms), rate
    (images/s) or memory (GB) it states is one a report in docs/results/
    holds with that unit, to the digits the page gives (ms: a report's
    seconds too; GB: its MB over 1000 or 1024): a figure changed by hand,
    derived on the page, or quoted from a run whose report is not kept
    fails here."""
    figures = report_figures()
    scales = {'ms': (('ms', 1), ('s', 1000)), 'images/s': (('images/s', 1), ),
              'GB': (('GB', 1), ('MB', 1 / 1000), ('MB', 1 / 1024))}

    def held(text, unit):
        value = float(text.replace(',', ''))
        digits = len(text.split('.')[1]) if '.' in text else 0
        return any(u == unit_of and round(v * k, digits) == value
                   for v, u in figures for unit_of, k in scales[unit])

    missing = []
    for page, start, section, block in page_paragraphs():
        if GPU_CONTEXT.search(section + block):
            for offset, line in enumerate(block.split('\n')):
                for m in FIGURE.finditer(line):
                    missing += [
                        f'{page}:{start + offset}: {g} {m.group(3)}'
                        for g in m.groups()[:2]
                        if g and not held(g, m.group(3))]
    assert not missing, missing


#: a duration of a GPU run in a page: a number or a range, in minutes or
#: hours
DURATION = re.compile(r'(?<![\w.–-])(\d[\d,]*(?:\.\d+)?)(?:–(\d[\d,]*'
                      r'(?:\.\d+)?))?\s?(min|minutes|h|hours)\b')
#: where a page speaks of a GPU's run time (its paragraph or its section's
#: title), unless the paragraph times the CPU ("without a GPU" beside it)
GPU_RUN = re.compile(r'H100|H200|\bGPU')
CPU_RUN = re.compile(r'\bCPU|this project\'s machine')
#: the stream a run time is extrapolated to by default: ACDC's protocol
PROTOCOL_IMAGES = 16000


def test_pages_state_only_gpu_durations_the_reports_give():
    """Where a page speaks of an H100 run, each duration it states in
    minutes or hours is a report's (its seconds or minutes), or follows
    from figures the same sentence states, which the test above holds to
    the reports: a count of images or steps its paragraph gives (else
    16,000, the protocol's) at a rate (images/s) or a step time (ms, s).
    An estimate whose inputs the sentence does not show, or a duration
    changed by hand, fails here."""
    figures = report_figures()
    durations = {v * k for v, u in figures for unit, k in (('s', 1 / 60),
                                                           ('min', 1))
                 if u == unit}

    def derived(sentence, block):
        counts = {PROTOCOL_IMAGES} | {
            int(c.replace(',', '')) for c in re.findall(
                r'(?<![\w.])(\d{1,3}(?:,\d{3})+|\d{4,})(?![\w.])', block)}
        found = set()
        for m in re.finditer(r'(?<![\w.])(\d+(?:\.\d+)?)(?:–(\d+(?:\.\d+)?'
                             r'))?\s?(images/s|ms|s)\b', sentence):
            for value in filter(None, m.groups()[:2]):
                value = float(value)
                for count in counts:
                    found.add(count / value / 60 if m.group(3) == 'images/s'
                              else count * value / (1000 if m.group(3) ==
                                                    'ms' else 1) / 60)
        return found

    def held(text, unit, minutes):
        value = float(text.replace(',', ''))
        digits = len(text.split('.')[1]) if '.' in text else 0
        scale = 60 if unit in ('h', 'hours') else 1
        return any(round(m / scale, digits) == value for m in minutes)

    missing = []
    for page, start, section, block in page_paragraphs():
        if not GPU_RUN.search(section + block) or CPU_RUN.search(block):
            continue
        # sentences: a full stop before a capital or a bracket
        for sentence in re.split(r'(?<=\.)\s+(?=[A-Z(\[`*])', block):
            minutes = durations | derived(sentence, block)
            line = start + block[:block.index(sentence)].count('\n')
            missing += [f'{page}:{line}: {g} {m.group(3)}'
                        for m in DURATION.finditer(sentence)
                        for g in m.groups()[:2]
                        if g and not held(g, m.group(3), minutes)]
    assert not missing, missing
