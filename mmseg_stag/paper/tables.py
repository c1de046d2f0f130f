"""Finished runs as the paper's table: our score beside the paper's (the
logic of ``tools/collect_results.py``, beside it as MMSeg keeps a tool's
logic in its tools, not in the package).

A run is a ``tools/test.py`` run: its ``continual_results.json`` (in its
work dir, or in the ``--out`` dir the config dumped in the work dir names)
and the config it ran, whose file name says the setting (the results'
``provenance.config``; for results written before the provenance, the
config MMEngine dumped into the work dir). Each run is checked against the
protocol of the paper's table (:data:`PROTOCOLS`) before anything is
written.

Runs of the realistic online protocol (``test_cfg.realtime``,
docs/realtime.md) and offline runs go to two tables, side by side
(``paper_table.*`` and ``paper_table_realtime.*``), a realistic table's
runs of one cost setting. Runs of one setting that differ by their seed
are one cell: the mean and the sample standard deviation (``ddof=1``)
over the seeds.
"""
import glob
import os.path as osp
import re
import statistics
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence

from mmengine.config import Config

from mmseg_stag.classification.data import CORRUPTIONS
from mmseg_stag.engine.report import (RESULTS_FILE, markdown_lines, new_figure,
                                      read_results, write_files)
from mmseg_stag.paper.results import SCORES, paper_result, paper_stages

#: ``configs/stag_acdc`` names (a fast preset's too); only the NVlabs B5 is
#: the paper's model
ACDC_NAME = re.compile(r'^segformer_mit-b5(?P<nvlabs>-nvlabs)?_acdc-continual_'
                       r'(?P<method>[a-z0-9-]+?)(?P<stag>-stag)?'
                       r'(?:_(?P<preset>bf16-graph|bf16))?\.py$')
#: ``configs/cls`` names
CLS_NAME = re.compile(r'^(?P<benchmark>imagenet-c|cifar10-c|cifar100-c)_'
                      r'(?P<scenario>[a-z0-9-]+)_(?P<model>[a-z0-9-]+)_'
                      r'(?P<method>[a-z0-9-]+?)(?P<stag>-stag)?\.py$')

#: configs/_base_/datasets/acdc_continual.py, in the paper's order
ACDC_CONDITIONS = ('fog', 'night', 'rain', 'snow')
#: The protocol of each table of the paper: the stages' conditions in
#: order, the rounds, the images of every stage, and settings of the test
#: dataset (dotted keys under ``test_dataloader.dataset``) the results'
#: provenance must show. ACDC (Table acdc_continual, SPEC §2): the train
#: split, 400 images a condition, 10 rounds; ImageNet-C: 50,000 images a
#: corruption at severity 5 (the mixed stream: all 15 in one stage);
#: CIFAR-C: 10,000 a corruption at severity 5 (the configs' n_examples).
#: tests/classification/test_collect_results.py checks them against the
#: configs.
PROTOCOLS = {
    ('acdc', 'continual'): dict(conditions=ACDC_CONDITIONS, rounds=10,
                                images=400, dataset={'split': 'train'}),
    **{('imagenet-c', scenario): dict(
        conditions=CORRUPTIONS, rounds=1, images=50000,
        dataset={'corruption_set.severity': 5})
       for scenario in ('mild', 'label-shift', 'bs1')},
    ('imagenet-c', 'mixed'): dict(conditions=('mixed', ), rounds=1,
                                  images=15 * 50000,
                                  dataset={'corruption_set.severity': 5}),
    **{(benchmark, 'continual'): dict(
        conditions=CORRUPTIONS, rounds=1, images=10000,
        dataset={'corruption_set.severity': 5})
       for benchmark in ('cifar10-c', 'cifar100-c')},
}
#: decimals of what the table writes: ours and STAG's gains (the paper's
#: scores have one or two)
DIGITS = 2


@dataclass
class Run:
    """One finished run and the setting its config names."""
    work_dir: str
    results_dir: str
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
    #: what sets it apart from the paper's run (short, bf16, a preset)
    marks: List[str] = field(default_factory=list)

    @property
    def label(self) -> str:
        return f'{self.model} {self.method}{"+STAG" if self.stag else ""}'

    @property
    def provenance(self) -> dict:
        return self.record.get('provenance') or {}

    @property
    def seed(self) -> Optional[int]:
        """The seed it ran with (its provenance's; None without one)."""
        return self.provenance.get('seed')

    @property
    def realtime(self) -> Optional[dict]:
        """The realistic protocol's record (``cost``, ``how``, ``period``,
        ``batches_adapted``, ``batches_predicted_only``, ``measured``);
        None for an offline run."""
        return self.record.get('realtime')


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


def dumped_configs(work_dir: str) -> List[str]:
    """The configs of shipped names MMEngine dumped into ``work_dir``."""
    return sorted(n for n in map(osp.basename,
                                 glob.glob(osp.join(work_dir, '*.py')))
                  if setting_of(n))


def results_dir(work_dir: str) -> str:
    """Where the run of ``work_dir`` wrote its results: the work dir, or
    the ``--out`` dir of ``tools/test.py`` that the config dumped there
    names (its ``test_evaluator.output_dir``)."""
    if osp.isfile(osp.join(work_dir, RESULTS_FILE)):
        return work_dir
    outs = []
    for name in dumped_configs(work_dir):
        # the dumped config is plain: nothing of it needs importing
        cfg = Config.fromfile(osp.join(work_dir, name),
                              import_custom_modules=False)
        evaluators = cfg.get('test_evaluator') or []
        for evaluator in evaluators if isinstance(evaluators, (
                list, tuple)) else [evaluators]:
            if evaluator.get('output_dir'):
                outs.append(evaluator['output_dir'])
    # the first metric writes the plain file names (report.result_file)
    return outs[0] if outs else work_dir


def run_config(work_dir: str, record: Optional[dict] = None) -> str:
    """The file name of the config the run ran: its results' provenance,
    else the config MMEngine dumped into ``work_dir`` (``ValueError`` if
    that is no shipped config's name, or there is none or more than
    one)."""
    ran = ((record or {}).get('provenance') or {}).get('config')
    names = [ran] if ran else sorted(
        osp.basename(p) for p in glob.glob(osp.join(work_dir, '*.py')))
    known = [n for n in names if setting_of(n)]
    if len(known) != 1:
        found = ', '.join(names) or 'no .py file'
        where = 'its results name (provenance.config)' if ran else \
            'found, as tools/test.py dumps it there'
        raise ValueError(
            f'{work_dir}: cannot tell the setting: it needs exactly one '
            'config of a shipped name (configs/stag_acdc/..., configs/cls/'
            f'...); {where}: {found}')
    return known[0]


def read_run(work_dir: str) -> Run:
    """Read a finished run and its setting (``FileNotFoundError`` if it
    did not finish, ``ValueError`` for results of another schema or a work
    dir whose setting cannot be told)."""
    work_dir = osp.normpath(work_dir)
    if not osp.isdir(work_dir):
        raise FileNotFoundError(f'{work_dir}: no such work dir')
    where = results_dir(work_dir)
    record = read_results(where)
    config = run_config(work_dir, record)
    setting = setting_of(config)
    metric, _ = SCORES[setting['benchmark']]
    if record['task'] == 'segmentation':
        score = record['mean_over_stages']
    else:
        acc = record['details']['acc_mean_over_corruptions']
        score = acc if metric == 'acc' else 100.0 - acc
    paper = paper_result(setting['benchmark'], setting['scenario'],
                         setting['model'], setting['method'],
                         setting['stag'])
    return Run(work_dir=work_dir, results_dir=where, config=config,
               score=score, paper=paper,
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


def cost_text(cost) -> str:
    """A step's cost as a table writes it: every digit of the float
    (``2.5``, ``3``), so that two costs never read the same."""
    text = repr(float(cost))
    return text[:-2] if text.endswith('.0') else text


def realtime_protocol(run: Run) -> Optional[str]:
    """A realistic run's protocol in words, the same for the runs of one
    cost setting (one given cost, or measured); None for an offline
    run."""
    realtime = run.realtime
    if realtime is None:
        return None
    if realtime.get('how') == 'measured':
        return "a step's cost measured on each run's first batch"
    return f"a step costs {cost_text(realtime['cost'])} forwards (given)"


def check_one_realtime(runs: Sequence[Run]) -> None:
    """Raise ``ValueError`` unless the realistic runs share one cost
    setting (all given one cost, or all measured), naming each run and
    its protocol."""
    found: Dict[str, List[str]] = OrderedDict()
    for run in runs:
        found.setdefault(realtime_protocol(run), []).append(run.work_dir)
    if len(found) > 1:
        raise ValueError(
            'runs of different realistic protocols (test_cfg.realtime): ' +
            '; '.join(f'{what}: {", ".join(dirs)}'
                      for what, dirs in found.items()) +
            '; a realistic table holds runs of one cost setting (one given '
            'cost, or all measured): collect them apart')


def adapted_share(run: Run) -> Optional[tuple]:
    """``(batches adapted, batches)`` of a realistic run; None offline."""
    realtime = run.realtime
    if realtime is None:
        return None
    adapted = int(realtime['batches_adapted'])
    return adapted, adapted + int(realtime['batches_predicted_only'])


def seed_groups(runs: Sequence[Run]) -> Dict[tuple, List[Run]]:
    """The runs by setting ``(model, method, stag)``, in their order: runs
    of one setting differ by their seed (``ValueError`` for two of one
    seed)."""
    groups: Dict[tuple, List[Run]] = OrderedDict()
    for run in runs:
        group = groups.setdefault((run.model, run.method, run.stag), [])
        twin = next((r for r in group if r.seed == run.seed), None)
        if twin is not None:
            raise ValueError(
                f'two runs of {run.label}, both of seed {run.seed}: '
                f'{twin.work_dir} and {run.work_dir} (the runs of one '
                'setting in a table differ by their seed)')
        group.append(run)
    return groups


def mean_std(scores: Sequence[float]) -> tuple:
    """The mean and the sample standard deviation (``ddof=1``; None for
    one score)."""
    return statistics.fmean(scores), (
        statistics.stdev(scores) if len(scores) > 1 else None)


def value_at(tree, key: str):
    """``tree['a']['b']`` of a dotted ``key='a.b'`` (``tree`` a dict or a
    ``Config``); None where a part is missing."""
    for part in key.split('.'):
        if not hasattr(tree, 'get') or part not in tree:
            return None
        tree = tree[part]
    return tree


def protocol_differences(run: Run) -> List[str]:
    """How ``run`` differs from its table's protocol (:data:`PROTOCOLS`):
    its stages (conditions, order, rounds), the images of each, the
    dataset settings its provenance shows; empty if it ran the paper's."""
    protocol = PROTOCOLS[(run.benchmark, run.scenario)]
    expected = [(r, c) for r in range(1, protocol['rounds'] + 1)
                for c in protocol['conditions']]
    stages = run.record['stages']
    found = [(s['round'], s['condition']) for s in stages]
    diffs = []
    if found != expected:
        diffs.append(f'{len(found)} stages ({run.rounds} round(s) of '
                     f'{", ".join(run.conditions)}), the paper '
                     f"{len(expected)} ({protocol['rounds']} round(s) of "
                     f"{', '.join(protocol['conditions'])})")
    counts = sorted({s['num_images'] for s in stages})
    if counts != [protocol['images']]:
        diffs.append(f'images per stage {", ".join(map(str, counts))}, the '
                     f"paper {protocol['images']}")
    dataset = run.provenance.get('dataset')
    for key, value in protocol['dataset'].items():
        found = None if dataset is None else value_at(dataset, key)
        if dataset is not None and found != value:
            # unset: the dataset class's default, which the config hides
            diffs.append(f'test_dataloader.dataset.{key}=' + (
                f'{found!r}' if found is not None else 'unset') +
                f', the paper {value!r}')
    return diffs


def speed_marks(run: Run) -> List[str]:
    """The run's options the paper's run did not use (it ran in float32,
    eagerly); a run without provenance is marked so."""
    prov = run.provenance
    if not prov:
        return ['no provenance (results of a version before it)']
    marks = []
    if prov.get('mixed_precision'):
        marks.append(f"{prov['mixed_precision']} autocast")
    if prov.get('preset'):
        marks.append(f"preset {prov['preset']}")
    if prov.get('cuda_graph'):
        marks.append('CUDA graph')
    return marks


def check_paper_protocol(runs: Sequence[Run], allow_short: bool) -> None:
    """Mark each run that is not the paper's (:func:`protocol_differences`,
    :func:`speed_marks`); raise ``ValueError`` naming each run of another
    protocol and the difference, unless ``allow_short``."""
    refused = []
    for run in runs:
        diffs = protocol_differences(run)
        run.marks = [f'short: {d}' for d in diffs] + speed_marks(run)
        if diffs:
            refused.append(f'{run.work_dir} ({run.config}): '
                           + '; '.join(diffs))
    if refused and not allow_short:
        raise ValueError(
            "runs of another protocol than the paper's table (its numbers "
            'are not comparable):\n  ' + '\n  '.join(refused) +
            '\nRun the whole protocol, or pass --allow-short to collect '
            'them marked')


def rounded(value, digits: int = DIGITS):
    """``value`` rounded to ``digits`` (None stays None): no float noise
    such as 0.7999999999999972 in what the table writes."""
    return None if value is None else round(float(value), digits)


def table_rows(groups: Dict[tuple, List[Run]]) -> List[dict]:
    """One row per (model, method): the baseline and +STAG, ours (the mean
    over a setting's seeds, ``*_ours_std`` their sample standard
    deviation, ``*_seeds`` the seeds) and the paper's, STAG's gain
    (positive: better; of the means) in each, and the marks."""
    first = next(iter(groups.values()))[0]
    lower_better = SCORES[first.benchmark][1]
    rows: Dict[tuple, dict] = OrderedDict()
    for (model, method, stag), runs in groups.items():
        row = rows.setdefault((model, method), dict(
            model=model, method=method, base_ours=None, base_ours_std=None,
            base_seeds=[], base_paper=rounded(paper_result(
                first.benchmark, first.scenario, model, method, False)),
            stag_ours=None, stag_ours_std=None, stag_seeds=[],
            stag_paper=rounded(paper_result(
                first.benchmark, first.scenario, model, method, True)),
            work_dirs=[], marks=[]))
        who = 'stag' if stag else 'base'
        row[f'{who}_ours'], row[f'{who}_ours_std'] = mean_std(
            [run.score for run in runs])
        row[f'{who}_seeds'] = [run.seed for run in runs]
        row['work_dirs'] += [run.work_dir for run in runs]
        for run in runs:  # a mark of several seeds once
            row['marks'] += [m for m in (
                f'{"+STAG" if stag else "base"}: {m}' for m in run.marks)
                if m not in row['marks']]
    for row in rows.values():
        for who in ('ours', 'paper'):
            base, stag = row[f'base_{who}'], row[f'stag_{who}']
            # from the unrounded scores; rounded as the scores are
            row[f'gain_{who}'] = None if base is None or stag is None else \
                rounded(base - stag if lower_better else stag - base)
        for key in ('base_ours', 'stag_ours', 'base_ours_std',
                    'stag_ours_std'):
            row[key] = rounded(row[key])
    return list(rows.values())


def run_summary(run: Run) -> dict:
    """What a run's row of the "runs" table shows: its setting, score,
    marks and provenance (commit, precision, preset, device, seed)."""
    prov = run.provenance
    code = prov.get('mmseg_stag') or {}
    return dict(
        label=run.label, work_dir=run.work_dir, results_dir=run.results_dir,
        config=run.config, score=rounded(run.score), marks=run.marks,
        commit=code.get('describe') or code.get('version'),
        precision=prov.get('mixed_precision') or (
            'float32' if prov else None),
        preset=prov.get('preset'), cuda_graph=prov.get('cuda_graph'),
        device=(prov.get('device') or {}).get('name'),
        seed=prov.get('seed'), deterministic=prov.get('deterministic'),
        images_per_second=prov.get('images_per_second'),
        realtime_cost=(run.realtime or {}).get('cost'),
        realtime_how=(run.realtime or {}).get('how'),
        batches_adapted=(adapted_share(run) or (None, None))[0],
        batches=(adapted_share(run) or (None, None))[1],
        provenance=prov or None)


def stage_means(runs: Sequence[Run]) -> Dict[tuple, float]:
    """``{(round, condition): score}``, each the mean over the runs (a
    setting's seeds) that reached the stage."""
    scores: Dict[tuple, List[float]] = OrderedDict()
    for run in runs:
        for s in run.record['stages']:
            scores.setdefault((s['round'], s['condition']), []).append(
                s['score'])
    return {k: statistics.fmean(v) for k, v in scores.items()}


def stage_rows(groups: Dict[tuple, List[Run]]) -> List[dict]:
    """ACDC: one row per stage, each setting's score (the mean over its
    seeds) beside the paper's for that setting (Table acdc_continual;
    None where the paper has none or the runs did not reach the
    stage)."""
    members = list(groups.values())
    rounds = max(max(run.rounds for runs in members for run in runs), 10)
    labels = [runs[0].label for runs in members]
    ours = [stage_means(runs) for runs in members]
    papers = [paper_stages(r.benchmark, r.scenario, r.model, r.method,
                           r.stag) or [] for r in (m[0] for m in members)]
    rows = []
    for i, (r, c) in enumerate((r, c) for r in range(1, rounds + 1)
                               for c in ACDC_CONDITIONS):
        row = dict(stage=i, round=r, condition=c)
        for name, scores, paper in zip(labels, ours, papers):
            row[f'{name} ours'] = rounded(scores.get((r, c)))
            row[f'{name} paper'] = paper[i] if i < len(paper) else None
        if any(row[f'{name} ours'] is not None for name in labels) or \
                r <= 10:
            rows.append(row)
    return rows


def _cell(value, sign=False) -> str:
    if value is None:
        return '-'
    if isinstance(value, float):
        return f'{value:+.{DIGITS}f}' if sign else f'{value:.{DIGITS}f}'
    return str(value)


def _ours(row: dict, who: str, counts: bool) -> str:
    """A cell of ours: the mean, ``± std`` over several seeds, and
    ``(n=k)`` where the cells' numbers of seeds differ (``counts``)."""
    text = _cell(row[f'{who}_ours'])
    if row[f'{who}_ours_std'] is not None:
        text += f' ± {row[f"{who}_ours_std"]:.{DIGITS}f}'
    if counts and row[f'{who}_seeds']:
        text += f' (n={len(row[f"{who}_seeds"])})'
    return text


def _csv(value):
    if value is None:
        return ''
    return ' '.join(map(str, value)) if isinstance(value, list) else value


COLUMNS = ('model', 'method', 'base_ours', 'base_paper', 'stag_ours',
           'stag_paper', 'gain_ours', 'gain_paper')
#: the CSV's columns after :data:`COLUMNS`: what a mean of seeds is over
SEED_COLUMNS = ('base_ours_std', 'stag_ours_std', 'base_seeds',
                'stag_seeds')
RUN_COLUMNS = ('label', 'commit', 'precision', 'preset', 'device', 'seed',
               'images_per_second', 'marks')


def seed_lists(rows: Sequence[dict]) -> List[list]:
    """The seeds of each cell of ours that has runs."""
    return [row[f'{who}_seeds'] for row in rows for who in ('base', 'stag')
            if row[f'{who}_seeds']]


def seeds_note(rows: Sequence[dict]) -> Optional[str]:
    """What ours are over several seeds; None where each cell is one
    run."""
    seeds = seed_lists(rows)
    if max(map(len, seeds)) == 1:
        return None
    same = all(sorted(map(str, s)) == sorted(map(str, seeds[0]))
               for s in seeds)
    over = (f'{len(seeds[0])} seeds ({", ".join(map(str, seeds[0]))})'
            if same else "each cell's seeds (n: how many)")
    return ('ours: the mean ± the sample standard deviation (ddof=1) over '
            f'{over}; a gain: the difference of the means')


def mixed_settings(summaries: Sequence[dict]) -> List[str]:
    """The run settings the collected runs do not share (a table of runs
    of mixed precision or presets compares more than the methods)."""
    return [f"{key}: {', '.join(sorted({str(s[key]) for s in summaries}))}"
            for key in ('precision', 'preset', 'commit', 'device')
            if len({str(s[key]) for s in summaries}) > 1]


def adapted_cell(summary: dict) -> str:
    """A realistic run's cost and share of its batches adapted."""
    cost, n = summary['realtime_cost'], summary['batches']
    cost = f'{cost:.3g} (measured)' if summary['realtime_how'] == \
        'measured' else cost_text(cost)
    share = summary['batches_adapted'] / max(n, 1)
    return (f'cost {cost}, {100 * share:.1f}% of the batches adapted '
            f"({summary['batches_adapted']:,} of {n:,})")


def realtime_lines(runs: Sequence[Run],
                   summaries: Sequence[dict]) -> List[str]:
    """A realistic table's head: its protocol, then each run's cost and
    share of batches adapted (from its record); none for offline runs."""
    protocol = realtime_protocol(runs[0])
    if protocol is None:
        return []
    seeded = len({(r.model, r.method, r.stag) for r in runs}) < len(runs)
    per_run = [s['label'] + (f" seed {s['seed']}" if seeded else '') +
               f': {adapted_cell(s)}' for s in summaries]
    return [f'realistic protocol (test_cfg.realtime, docs/realtime.md): '
            f'{protocol}; a batch that arrives during a step is predicted '
            'by the current weights, no update, and scored. The paper\'s '
            'scores are offline (every batch adapts).', '',
            'batches adapted per run: ' + '; '.join(per_run), '']


def score_lines(runs: Sequence[Run], rows: Sequence[dict]) -> List[str]:
    """The table's line, the table of ours beside the paper's, and the
    notes on it (seeds, the MMSeg model, the marks)."""
    metric, lower_better = SCORES[runs[0].benchmark]
    what = dict(mIoU='mean mIoU over the stages (%)',
                acc='accuracy (%), mean over the corruptions',
                err='error (%), mean over the corruptions')[metric]
    head = ['model', 'method', 'ours', 'paper', '+STAG ours', '+STAG paper',
            'gain ours', 'gain paper', 'marks']
    counts = len({len(s) for s in seed_lists(rows)}) > 1

    def cell(row, column):
        if column in ('base_ours', 'stag_ours'):
            return _ours(row, column[:4], counts)
        return _cell(row[column], sign=column.startswith('gain'))

    lines = [f'{runs[0].benchmark}, {runs[0].scenario}: {what}'
             f'{", lower is better" if lower_better else ""}; '
             f'{len(runs)} runs, {runs[0].rounds} round(s) of '
             f'{", ".join(runs[0].conditions)}', ''] + markdown_lines(
                 head, [[cell(row, c) for c in COLUMNS] +
                        ['; '.join(row['marks'])] for row in rows])
    note = seeds_note(rows)
    if note:
        lines += ['', note]
    if any(row['model'] == 'segformer-b5-mmseg' for row in rows):
        lines += ['', 'segformer-b5-mmseg: the MMSeg model-zoo checkpoint '
                  '(not the paper\'s NVlabs one): no paper score.']
    if any(row['marks'] for row in rows):
        lines += ['', 'marks: what the run did unlike the paper\'s (short: '
                  'another protocol, collected with --allow-short; '
                  'autocast, preset: not float32 and eager)']
    return lines


def format_paper_table(runs: Sequence[Run], rows: Sequence[dict],
                       summaries: Sequence[dict],
                       stages: Optional[Sequence[dict]]) -> str:
    """The Markdown table, the paper's score beside each of ours (a
    realistic table headed with its protocol); the runs and their
    provenance; for ACDC every stage beside the paper's."""
    lines = realtime_lines(runs, summaries) + score_lines(runs, rows)
    mixed = mixed_settings(summaries)
    if mixed:
        lines += ['', 'the runs differ in ' + '; '.join(mixed)]
    realistic = runs[0].realtime is not None
    lines += ['', 'runs:', ''] + markdown_lines(
        ['run', 'commit', 'precision', 'preset', 'device', 'seed',
         'images/s', 'marks'] + (['realtime'] if realistic else []),
        [[_cell(s[c]) if c != 'marks' else '; '.join(s[c]) or '-'
          for c in RUN_COLUMNS] + ([adapted_cell(s)] if realistic else [])
         for s in summaries])
    if stages:
        # one column pair per setting: a mean over its seeds
        labels = list(OrderedDict.fromkeys(run.label for run in runs))
        mean = ', ours the mean over the seeds' if len(labels) < len(
            runs) else ''
        lines += ['', 'every stage (mIoU %), ours beside the paper\'s '
                  f'(Table acdc_continual{mean}):', ''] + markdown_lines(
            ['round', 'condition'] + [f'{lb} {w}' for lb in labels
                                      for w in ('ours', 'paper')],
            [[s['round'], s['condition']] + [
                _cell(s[f'{lb} {w}']) for lb in labels
                for w in ('ours', 'paper')] for s in stages])
    return '\n'.join(lines)


def plot_table(path: str, runs: Sequence[Run], rows: Sequence[dict]) -> None:
    """Bars per (model, method): ours (the standard deviation over the
    seeds as an error bar) and the paper's, baseline and +STAG."""
    metric, _ = SCORES[runs[0].benchmark]
    fig = new_figure(max(6.0, 1.3 * len(rows) + 2), 4.2)
    ax = fig.add_subplot(1, 1, 1)
    bars = (('base_ours', 'ours'), ('base_paper', 'paper'),
            ('stag_ours', '+STAG ours'), ('stag_paper', '+STAG paper'))
    width = 0.8 / len(bars)
    for i, (key, label) in enumerate(bars):
        xs = [j + (i - 1.5) * width for j in range(len(rows))]
        errors = [r.get(f'{key}_std') or 0.0 for r in rows]
        ax.bar(xs, [float('nan') if r[key] is None else r[key]
                    for r in rows], width, label=label,
               yerr=errors if any(errors) else None, capsize=3,
               hatch='//' if 'paper' in key else None,
               alpha=0.6 if 'paper' in key else 1.0)
    ax.set_xticks(list(range(len(rows))))
    ax.set_xticklabels([f"{r['model']}\n{r['method']}" for r in rows],
                       fontsize='small')
    ax.set_ylabel(dict(mIoU='mean mIoU (%)', acc='accuracy (%)',
                       err='error (%)')[metric])
    realistic = ', realistic protocol' if runs[0].realtime else ''
    ax.set_title(f'{runs[0].benchmark}, {runs[0].scenario}{realistic}: '
                 "ours and the paper's")
    ax.grid(axis='y', alpha=.3)
    ax.legend(fontsize='small', ncol=4, loc='lower center',
              bbox_to_anchor=(0.5, 1.08), frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def plot_continual_graph(path: str, groups: Dict[tuple, List[Run]]) -> None:
    """The paper's Figure 5 (``fig:continual_graph``): each condition's
    mIoU across the rounds, one curve per collected setting (the mean over
    its seeds), the paper's curve of the same setting dashed in the same
    colour."""
    fig = new_figure(13, 3.6)
    axes = [fig.add_subplot(1, 4, k + 1) for k in range(4)]
    members = list(groups.values())
    colours = [f'C{k % 10}' for k in range(len(members))]
    for k, condition in enumerate(ACDC_CONDITIONS):
        ax = axes[k]
        for runs, colour in zip(members, colours):
            run = runs[0]
            pts = sorted((r, v) for (r, c), v in stage_means(runs).items()
                         if c == condition)
            ours = 'ours' if len(runs) == 1 else \
                f'ours, mean of {len(runs)} seeds'
            if pts:
                ax.plot(*zip(*pts), color=colour, marker='o', ms=3,
                        label=f'{run.label} ({ours})')
            paper = paper_stages(run.benchmark, run.scenario, run.model,
                                 run.method, run.stag)
            if paper:
                ax.plot(range(1, 11), paper[k::4], color=colour, ls='--',
                        label=f'{run.label} (paper)')
        ax.set_title(condition)
        ax.set_xlabel('round')
        ax.grid(alpha=.3)
    axes[0].set_ylabel('mIoU (%)')
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, fontsize='small', ncol=min(4, len(labels)),
               loc='upper center', frameon=False)
    fig.tight_layout(rect=(0, 0, 1, 0.88))
    fig.savefig(path, dpi=120)


def write_table(runs: Sequence[Run], groups: Dict[tuple, List[Run]],
                out_dir: str, stem: str, graph: str) -> Dict[str, str]:
    """One table (runs of one protocol, :func:`seed_groups` of them):
    ``<stem>.{md,csv,json,png}``, for ACDC ``<stem>_stages.csv`` and
    Figure 5 as ``<graph>.png``; return the paths as :func:`collect`."""
    rows = table_rows(groups)
    summaries = [run_summary(r) for r in runs]
    acdc = runs[0].benchmark == 'acdc'
    stages = stage_rows(groups) if acdc else None
    realtime = realtime_protocol(runs[0])
    paths = write_files(
        out_dir, stem,
        dict(benchmark=runs[0].benchmark, scenario=runs[0].scenario,
             metric=SCORES[runs[0].benchmark][0],
             protocol='offline' if realtime is None else 'realtime',
             realtime=realtime, seeds=seeds_note(rows), rows=rows,
             runs=summaries, mixed=mixed_settings(summaries),
             stages=stages, results_file=RESULTS_FILE),
        [COLUMNS + SEED_COLUMNS + ('marks', )] + [
            [_csv(row[c]) for c in COLUMNS + SEED_COLUMNS] +
            ['; '.join(row['marks'])] for row in rows],
        format_paper_table(runs, rows, summaries, stages))
    plot_table(paths['png'], runs, rows)
    written = {k: paths[k] for k in ('md', 'csv', 'json', 'png')}
    if acdc:
        columns = list(stages[0])
        written['stages_csv'] = write_files(
            out_dir, f'{stem}_stages',
            cells=[columns] + [['' if s[c] is None else s[c]
                                for c in columns] for s in stages])['csv']
        written['graph'] = osp.join(out_dir, f'{graph}.png')
        plot_continual_graph(written['graph'], groups)
    return written


def collect(work_dirs: Sequence[str], out_dir: str,
            stem: str = 'paper_table',
            allow_short: bool = False) -> Dict[str, str]:
    """Write the tables of finished runs (Markdown, CSV, JSON, PNG; for
    ACDC also every stage as CSV and Figure 5) into ``out_dir``, every run
    read and checked first: the offline runs' as ``<stem>.*`` (Figure 5
    ``continual_graph.png``), the realistic runs' (``test_cfg.realtime``)
    beside it as ``<stem>_realtime.*`` (``continual_graph_realtime.png``),
    each where it has runs; the runs of a setting that differ by their
    seed are one cell, their mean ± sample standard deviation. Return the
    paths, keyed ``md``, ``csv``, ``json``, ``png`` (and ``stages_csv``,
    ``graph``), the realistic table's ``realtime_md``, ...

    Raises:
        FileNotFoundError: For a missing or unfinished work dir.
        ValueError: For results of another schema, a work dir whose
            setting cannot be told, runs of different protocols, a run of
            another protocol than the paper's table (unless
            ``allow_short``: marked), realistic runs of different cost
            settings, or two runs of one setting and seed.
    """
    runs = [read_run(w) for w in work_dirs]
    check_one_protocol(runs)
    check_paper_protocol(runs, allow_short)
    offline = [r for r in runs if r.realtime is None]
    realistic = [r for r in runs if r.realtime is not None]
    check_one_realtime(realistic)
    # every table's runs grouped (two of one seed refused) before a file
    # is written
    tables = [(kind, seed_groups(kind), suffix) for kind, suffix in (
        (offline, ''), (realistic, '_realtime')) if kind]
    written: Dict[str, str] = {}
    for kind, groups, suffix in tables:
        paths = write_table(kind, groups, out_dir, stem + suffix,
                            'continual_graph' + suffix)
        written.update({('realtime_' if suffix else '') + key: path
                        for key, path in paths.items()})
    return written
