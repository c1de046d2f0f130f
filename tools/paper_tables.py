"""Finished runs as the paper's table: our score beside the paper's (the
logic of ``tools/collect_results.py``, beside it as MMSeg keeps a tool's
logic in its tools, not in the package).

A run is a work dir of ``tools/test.py`` with its ``continual_results.json``
and the config MMEngine dumped there, whose file name says the setting.
"""
import glob
import os.path as osp
import re
from collections import OrderedDict
from dataclasses import asdict, dataclass
from typing import Dict, List, Optional, Sequence

from mmseg_stag.engine.report import (RESULTS_FILE, markdown_table, new_figure,
                            read_results, write_files)
from mmseg_stag.paper_results import METRICS, paper_result

#: ``configs/stag_acdc`` names; only the NVlabs B5 is the paper's model
ACDC_NAME = re.compile(r'^segformer_mit-b5(?P<nvlabs>-nvlabs)?_acdc-continual_'
                       r'(?P<method>[a-z0-9-]+?)(?P<stag>-stag)?\.py$')
#: ``configs/cls`` names
CLS_NAME = re.compile(r'^(?P<benchmark>imagenet-c|cifar10-c|cifar100-c)_'
                      r'(?P<scenario>[a-z0-9-]+)_(?P<model>[a-z0-9-]+)_'
                      r'(?P<method>[a-z0-9-]+?)(?P<stag>-stag)?\.py$')


@dataclass
class Run:
    """One finished run and the setting its config names."""
    work_dir: str
    config: str
    benchmark: str
    scenario: str
    model: str
    method: str  # the paper's name: bn_adapt, tent, ecotta-k4, ...
    stag: bool
    score: float
    paper: Optional[float]
    conditions: List[str]
    rounds: int
    record: dict


def setting_of(config_name: str) -> Optional[dict]:
    """``benchmark, scenario, model, method, stag`` of a config file name;
    None if it is none of the shipped configs' names."""
    match = ACDC_NAME.match(config_name)
    if match:
        model = 'segformer-b5' if match['nvlabs'] else 'segformer-b5-mmseg'
        found = dict(benchmark='acdc', scenario='continual', model=model,
                     method=match['method'])
    else:
        match = CLS_NAME.match(config_name)
        if not match:
            return None
        found = {k: match[k] for k in ('benchmark', 'scenario', 'model',
                                       'method')}
    # config names spell bn-adapt, hybrid-tta; the paper's table bn_adapt
    if not found['method'].startswith('ecotta'):
        found['method'] = found['method'].replace('-', '_')
    return dict(found, stag=bool(match['stag']))


def run_config(work_dir: str) -> str:
    """The config file MMEngine dumped into ``work_dir`` whose name says
    the setting (``ValueError`` if there is none, or more than one)."""
    names = sorted(osp.basename(p) for p in glob.glob(osp.join(work_dir,
                                                               '*.py')))
    known = [n for n in names if setting_of(n)]
    if len(known) != 1:
        found = ', '.join(names) or 'no .py file'
        raise ValueError(
            f'{work_dir}: cannot tell the setting: it needs exactly one '
            'config of a shipped name (configs/stag_acdc/..., configs/cls/'
            f'...), as tools/test.py dumps it there; found {found}')
    return known[0]


def read_run(work_dir: str) -> Run:
    """Read a finished run and its setting (``FileNotFoundError`` if it
    did not finish, ``ValueError`` for results of another schema or a work
    dir whose setting cannot be told)."""
    work_dir = osp.normpath(work_dir)
    if not osp.isdir(work_dir):
        raise FileNotFoundError(f'{work_dir}: no such work dir')
    record = read_results(work_dir)
    config = run_config(work_dir)
    setting = setting_of(config)
    metric, _ = METRICS[setting['benchmark']]
    if record['task'] == 'segmentation':
        score = record['mean_over_stages']
    else:
        acc = record['details']['acc_mean_over_corruptions']
        score = acc if metric == 'acc' else 100.0 - acc
    paper = paper_result(setting['benchmark'], setting['scenario'],
                         setting['model'], setting['method'],
                         setting['stag'])
    return Run(work_dir=work_dir, config=config, score=score, paper=paper,
               conditions=list(record['conditions']),
               rounds=int(record['rounds']), record=record, **setting)


def check_one_protocol(runs: Sequence[Run]) -> None:
    """Raise ``ValueError`` unless the runs share a task, benchmark,
    scenario, conditions and rounds (one table of the paper)."""
    if not runs:
        raise ValueError('no work dir given')
    first = runs[0]
    for run in runs[1:]:
        for what, ours, theirs in (
                ('task', run.record['task'], first.record['task']),
                ('benchmark', run.benchmark, first.benchmark),
                ('scenario', run.scenario, first.scenario),
                ('conditions', run.conditions, first.conditions),
                ('rounds', run.rounds, first.rounds)):
            if ours != theirs:
                raise ValueError(
                    f'{run.work_dir} and {first.work_dir} ran different '
                    f'protocols ({what}: {ours} vs {theirs}); one table '
                    'holds runs of one protocol')


#: decimals of our gain as written (the scores' own rounding is far below)
GAIN_DIGITS = 6


def table_rows(runs: Sequence[Run]) -> List[dict]:
    """One row per (model, method): the baseline and +STAG, ours and the
    paper's, and STAG's gain (positive: better) in each."""
    lower_better = METRICS[runs[0].benchmark][1]
    rows: Dict[tuple, dict] = OrderedDict()
    for run in runs:
        row = rows.setdefault((run.model, run.method), dict(
            model=run.model, method=run.method, base_ours=None,
            base_paper=paper_result(run.benchmark, run.scenario, run.model,
                                    run.method, False),
            stag_ours=None, stag_paper=paper_result(
                run.benchmark, run.scenario, run.model, run.method, True),
            work_dirs=[]))
        ours = 'stag_ours' if run.stag else 'base_ours'
        if row[ours] is not None:
            raise ValueError(f'two runs of {run.model} {run.method}'
                             f'{"+STAG" if run.stag else ""}: '
                             f"{row['work_dirs'][-1]} and {run.work_dir}")
        row[ours] = run.score
        row['work_dirs'].append(run.work_dir)
    for row in rows.values():
        for who, digits in (('ours', GAIN_DIGITS), ('paper', 2)):
            base, stag = row[f'base_{who}'], row[f'stag_{who}']
            # rounded: a difference of two decimals writes 4.800000000000004
            # (the paper's scores have one or two decimals)
            row[f'gain_{who}'] = None if base is None or stag is None else \
                round(base - stag if lower_better else stag - base, digits)
    return list(rows.values())


COLUMNS = ('model', 'method', 'base_ours', 'base_paper', 'stag_ours',
           'stag_paper', 'gain_ours', 'gain_paper')


def _cell(value, sign=False) -> str:
    if value is None:
        return '-'
    if isinstance(value, float):
        return f'{value:+.1f}' if sign else f'{value:.1f}'
    return str(value)


def format_table(runs: Sequence[Run], rows: Sequence[dict]) -> str:
    """The Markdown table, the paper's score beside each of ours."""
    metric, lower_better = METRICS[runs[0].benchmark]
    what = dict(mIoU='mean mIoU over the stages (%)',
                acc='accuracy (%), mean over the corruptions',
                err='error (%), mean over the corruptions')[metric]
    head = ['model', 'method', 'ours', 'paper', '+STAG ours', '+STAG paper',
            'gain ours', 'gain paper']
    lines = [f'{runs[0].benchmark}, {runs[0].scenario}: {what}'
             f'{", lower is better" if lower_better else ""}; '
             f'{len(runs)} runs, {runs[0].rounds} round(s) of '
             f'{", ".join(runs[0].conditions)}', ''] + markdown_table(
                 head, [[_cell(row[c], sign=c.startswith('gain'))
                         for c in COLUMNS] for row in rows])
    if any(row['model'] == 'segformer-b5-mmseg' for row in rows):
        lines += ['', 'segformer-b5-mmseg: the MMSeg model-zoo checkpoint '
                  '(not the paper\'s NVlabs one): no paper score.']
    return '\n'.join(lines)


def plot_table(path: str, runs: Sequence[Run], rows: Sequence[dict]) -> None:
    """Bars per (model, method): ours and the paper's, baseline and +STAG."""
    metric, _ = METRICS[runs[0].benchmark]
    fig = new_figure(max(6.0, 1.3 * len(rows) + 2), 4.2)
    ax = fig.add_subplot(1, 1, 1)
    bars = (('base_ours', 'ours'), ('base_paper', 'paper'),
            ('stag_ours', '+STAG ours'), ('stag_paper', '+STAG paper'))
    width = 0.8 / len(bars)
    for i, (key, label) in enumerate(bars):
        xs = [j + (i - 1.5) * width for j in range(len(rows))]
        ax.bar(xs, [float('nan') if r[key] is None else r[key]
                    for r in rows], width, label=label,
               hatch='//' if 'paper' in key else None,
               alpha=0.6 if 'paper' in key else 1.0)
    ax.set_xticks(list(range(len(rows))))
    ax.set_xticklabels([f"{r['model']}\n{r['method']}" for r in rows],
                       fontsize='small')
    ax.set_ylabel(dict(mIoU='mean mIoU (%)', acc='accuracy (%)',
                       err='error (%)')[metric])
    ax.set_title(f'{runs[0].benchmark}, {runs[0].scenario}: ours and the '
                 "paper's")
    ax.grid(axis='y', alpha=.3)
    ax.legend(fontsize='small', ncol=4, loc='lower center',
              bbox_to_anchor=(0.5, 1.08), frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def collect(work_dirs: Sequence[str], out_dir: str,
            stem: str = 'paper_table') -> Dict[str, str]:
    """Write the table of finished runs (Markdown, CSV, JSON, PNG) into
    ``out_dir``, every run read and checked first; return the paths, keyed
    ``md``, ``csv``, ``json``, ``png``.

    Raises:
        FileNotFoundError: For a missing or unfinished work dir.
        ValueError: For results of another schema, a work dir whose
            setting cannot be told, runs of different protocols, or two
            runs of one setting.
    """
    runs = [read_run(w) for w in work_dirs]
    check_one_protocol(runs)
    rows = table_rows(runs)
    runs_out = [{k: v for k, v in asdict(r).items() if k != 'record'}
                for r in runs]
    paths = write_files(
        out_dir, stem,
        dict(benchmark=runs[0].benchmark, scenario=runs[0].scenario,
             metric=METRICS[runs[0].benchmark][0], rows=rows, runs=runs_out,
             results_file=RESULTS_FILE),
        [COLUMNS] + [['' if row[c] is None else row[c] for c in COLUMNS]
                     for row in rows],
        format_table(runs, rows))
    plot_table(paths['png'], runs, rows)
    return {k: paths[k] for k in ('md', 'csv', 'json', 'png')}
