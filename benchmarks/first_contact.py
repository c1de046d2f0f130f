"""First contact with a GPU: is the fast path right? (``tools/gpu_check.py
--first-contact``, the first part of ``make gpu-check``; docs/benchmark.md,
"First contact").

Each arm is one shipped config run as ``tools/test.py`` runs it (its
loader, loss, metric: the whole loop) on the real SegFormer-B5 with seeded
random weights and generated ACDC-layout frames, in a process of its own
(a sticky CUDA error fails that arm alone)::

    parent: plan -> per arm a process forked from a server that imported
            the stack once, under its own timeout -> compare ->
            first_contact.{md,json}
    arm:    Runner(config + options) -> loop (graph steps counted) ->
            per-step losses, adapted weights, images/s, peak memory

Each graph preset runs beside the same preset with ``cuda_graph=False`` at
a learning rate where a wrong or missing update shows (:data:`CHECK_LR`),
and their per-step losses and weight updates are compared
(:data:`TOLERANCES`); the graph arm must have captured and replayed on
batches other than the captured one. Two more arms: the eager arm again
(the noise floor: what the same run moves by on this GPU) and the graph
arm with 0 loader workers (no pin-memory thread beside the capture).
"""
import ast
import dataclasses
import json
import math
import os
import os.path as osp
import time
from typing import Dict, List, Optional

#: the graph presets' learning rate in the check (the configs' 7.5e-6
#: barely moves B5 in a few steps: a replay that updates nothing would
#: pass); Adam's first steps then move every adapted value by about this
CHECK_LR = 1e-3

#: what bfloat16 warrants between a graph and its eager run. Both run the
#: same kernels on the same inputs; a replay differs only in the order of
#: reductions (and atomics in the backward), each bfloat16 rounding being
#: 2^-9 relative (0.2 %): a step's loss within 2 % (10 such roundings),
#: the total weight update within 10 % of its size (Adam divides by the
#: gradient's root mean square, so a sign flip of a near-zero gradient
#: moves a value by a whole step), a stage's mIoU within 1 point. A replay
#: that updates nothing is 100 % off; one that steps on the captured batch
#: instead of the new one moves the loss by far more than 2 %. First set
#: without a GPU (the noise-floor arm measures what the GPU itself moves)
TOLERANCES = dict(loss_rel=0.02, update_rel=0.10, score_abs=1.0)


@dataclasses.dataclass
class Arm:
    """One run: ``config`` the method part of the NVlabs config's name,
    ``graph`` its ``cuda_graph`` (None: the config's), ``workers`` the
    loader's (None: the config's), ``lr`` the optimizer's (None: the
    config's), ``images`` per condition."""
    name: str
    config: str
    images: int
    graph: Optional[bool] = None
    workers: Optional[int] = None
    lr: Optional[float] = None


@dataclasses.dataclass
class Comparison:
    """``graph`` against ``eager`` (arm names); ``kind``: ``'graph'`` (a
    graph must have replayed on new batches) or ``'noise'`` (two eager
    runs: the noise floor, reported, not judged)."""
    name: str
    graph: str
    eager: str
    kind: str = 'graph'


def plan(images: int, cotta_images: int) -> tuple:
    """The arms and comparisons of the check: each graph preset against
    itself eager (TENT, TENT+STAG, CoTTA and CoTTA+STAG at
    :data:`CHECK_LR`), BN Adapt's preset with its statistics pass as a
    graph (no optimizer), the noise floor and the 0-worker control."""
    arms, comparisons = [], []

    def pair(label, config, n, lr, graph_cfg=None):
        arms.append(Arm(f'{label} graph', config, n, graph=graph_cfg, lr=lr))
        arms.append(Arm(f'{label} eager', config, n, graph=False, lr=lr))
        comparisons.append(Comparison(label, f'{label} graph',
                                      f'{label} eager'))

    pair('tent-stag', 'tent-stag_bf16-graph', images, CHECK_LR)
    arms.append(Arm('tent-stag eager again', 'tent-stag_bf16-graph', images,
                    graph=False, lr=CHECK_LR))
    comparisons.append(Comparison('noise floor (eager twice)',
                                  'tent-stag eager again', 'tent-stag eager',
                                  kind='noise'))
    arms.append(Arm('tent-stag graph, 0 workers', 'tent-stag_bf16-graph',
                    images, workers=0, lr=CHECK_LR))
    comparisons.append(Comparison('tent-stag, 0 workers',
                                  'tent-stag graph, 0 workers',
                                  'tent-stag eager'))
    pair('tent', 'tent_bf16-graph', images, CHECK_LR)
    pair('bn-adapt', 'bn-adapt_bf16', images, None, graph_cfg=True)
    pair('cotta', 'cotta_bf16-graph', cotta_images, CHECK_LR)
    pair('cotta-stag', 'cotta-stag_bf16-graph', cotta_images, CHECK_LR)
    return arms, comparisons


#: the generated stream's conditions the check runs: two stages (a stage
#: restart between them, which must keep the graph)
CHECK_CONDITIONS = ('fog', 'night')


def arm_options(arm: Arm, data_root: str, base: dict, quick: bool) -> dict:
    """``--cfg-options`` of ``arm`` on the generated stream (``base``: the
    model's, tiny under ``quick``). No logger interval inside the stream:
    the statistics are read at the stage ends only, and MMEngine's log
    processor does not reset the peak memory mid-run."""
    opts = dict(base)
    opts.update({
        'test_dataloader.dataset.data_root': data_root,
        'test_dataloader.dataset.conditions': CHECK_CONDITIONS,
        'test_dataloader.dataset.rounds': 1,
        'test_dataloader.dataset.images_per_condition': arm.images,
        'test_cfg.save_state': False,
        'default_hooks.logger.interval': 10**6})
    if arm.graph is not None:
        opts['test_cfg.cuda_graph'] = arm.graph
    if arm.workers is not None:
        opts['test_dataloader.num_workers'] = arm.workers
    elif quick:
        opts['test_dataloader.num_workers'] = 2  # a 2-core machine
    if arm.lr is not None:
        opts['test_cfg.method.optimizer.lr'] = arm.lr
    if quick:
        # bfloat16 convolutions crawl on a CPU without bf16 units
        opts['test_cfg.mixed_precision'] = None
    return opts


# ------------------------------------------------------------------ arm
def count_graph_steps():
    """Wrap ``CUDAGraphStep`` to count, per run, its captures, replays and
    replays on a batch other than the captured one (compared on the
    device, read once at the end: no wait inside the stream). Returns the
    counts' dict, filled as the loop runs."""

    from mmseg_stag.core.methods.step_graph import CUDAGraphStep
    counts = dict(captures=0, replays=0, eager_steps=0, on_new=None)
    capture, call = CUDAGraphStep.capture, CUDAGraphStep.__call__
    captured = {}  # graph key -> the captured batch's inputs

    def counted_capture(self, batch, beta):
        from mmseg_stag.core.methods.step_graph import graph_key
        counts['captures'] += 1
        captured[graph_key(batch)] = batch.inputs.clone()
        return capture(self, batch, beta)

    def counted_call(self, batch, beta):
        from mmseg_stag.core.methods.step_graph import graph_key
        key, eager_before = graph_key(batch), dict(self.eager_steps)
        out = call(self, batch, beta)
        # an eager step counts itself in eager_steps; a capture and a
        # replay leave them as they were, the graph kept
        if key not in self.graphs or self.eager_steps != eager_before:
            counts['eager_steps'] += 1
            return out
        counts['replays'] += 1
        new = (batch.inputs != captured[key]).any().long()
        counts['on_new'] = new if counts['on_new'] is None else \
            counts['on_new'] + new
        return out

    CUDAGraphStep.capture = counted_capture
    CUDAGraphStep.__call__ = counted_call
    return counts


def record_waits(loop):
    """On CUDA: turn on CUDA's sync debug mode (a warning at every call
    that makes the host wait for the GPU) and record each one with the
    batch it came in (``'stage end'`` inside the loop's ``end_stage``,
    ``'before'`` / ``'after'`` outside the stream) and the package line
    that called it. Returns the records' list, filled as the loop runs."""
    import traceback
    import warnings

    import torch
    waits, where = [], dict(batch='before')
    run_iter, end_stage = loop.run_iter, loop.end_stage

    def at_batch(idx, data_batch):
        where['batch'] = idx
        run_iter(idx, data_batch)
        where['batch'] = 'after'

    def at_end(*args):
        batch, where['batch'] = where['batch'], 'stage end'
        try:
            end_stage(*args)
        finally:
            where['batch'] = batch

    shown = warnings.showwarning

    def show(message, category, filename, lineno, file=None, line=None):
        if 'synchronizing CUDA operation' not in str(message):
            return shown(message, category, filename, lineno, file, line)
        frames = [f for f in traceback.extract_stack()[:-1]
                  if '/mmseg_stag/' in f.filename]
        site = (f'{frames[-1].filename.rsplit("/mmseg_stag/", 1)[1]}:'
                f'{frames[-1].lineno} {frames[-1].name}' if frames
                else f'{filename}:{lineno}')
        waits.append(dict(batch=where['batch'], site=site))

    loop.run_iter, loop.end_stage = at_batch, at_end
    warnings.showwarning = show
    warnings.simplefilter('always')
    torch.cuda.set_sync_debug_mode('warn')
    return waits


#: the first batches of a run, whose waits for the GPU are not the loop's:
#: the graph's two eager warm-up steps (lazy initialisations) and its
#: capture (``torch.cuda.graph`` synchronises before it)
SETTLING_BATCHES = 3


def waits_inside_stages(waits: List[dict], skip: int) -> List[dict]:
    """The waits in a stream's batches, the first ``skip`` of the run (the
    eager warm-up and the capture: lazy initialisations, the capture's own
    synchronize) aside."""
    return [w for w in waits if isinstance(w['batch'], int)
            and w['batch'] >= skip]


def run_arm(spec: dict) -> dict:
    """One arm in this process (``spec``: config, options, checkpoint,
    work dir, weights file, stand-in): what :func:`compare` reads."""
    import torch
    from mmengine.config import Config

    from mmseg_stag.engine.runs import prepare_config, run_test
    if spec.get('stand_in'):
        from benchmarks import stand_in_graph
        stand_in_graph.install(loop=True)
    counts = count_graph_steps()
    cfg = Config.fromfile(spec['config'])
    # a Python literal: JSON would turn the options' tuples (a Resize
    # scale) into lists
    cfg.merge_from_dict(ast.literal_eval(spec['options']))
    cfg = prepare_config(cfg, spec['work_dir'], spec['config'])
    waits = None
    if torch.cuda.is_available():
        from mmengine.hooks import Hook

        class RecordWaits(Hook):
            def before_test(self, runner):
                nonlocal waits
                waits = record_waits(runner.test_loop)

        hooks = [RecordWaits()]
    else:
        hooks = []
    t0 = time.perf_counter()
    _, model = run_test(cfg, spec['checkpoint'], hooks=hooks)
    if waits is not None:
        torch.cuda.set_sync_debug_mode('default')
    seconds = time.perf_counter() - t0
    from mmengine.logging import MessageHub
    hub = MessageHub.get_current_instance()
    losses = {key[len('test/'):]: [float(v) for v in buffer.data[0]]
              for key, buffer in hub.log_scalars.items()
              if key in ('test/loss', 'test/loss_stag')}
    with open(osp.join(spec['work_dir'], 'continual_results.json')) as f:
        record = json.load(f)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    torch.save({n: p.detach().float().cpu() for n, p in
                model.named_parameters() if n in trainable},
               spec['weights'])
    on_new = counts.pop('on_new')
    cuda = torch.cuda.is_available()
    provenance = record.get('provenance', {})
    images = provenance.get('images') or sum(
        s['num_images'] for s in record['stages'])
    loop_seconds = provenance.get('seconds')
    return dict(
        counts, replays_on_new=0 if on_new is None else int(on_new),
        losses=losses, scores=[s['score'] for s in record['stages']],
        num_updates=record.get('num_updates'), images=images,
        loop_seconds=loop_seconds, run_seconds=seconds,
        images_per_s=images / loop_seconds if loop_seconds else None,
        peak_memory_mib=torch.cuda.max_memory_allocated() / 2**20
        if cuda else None,
        trainable=len(trainable), waits=waits)


# --------------------------------------------------------------- parent
#: what the arms' processes import once, in the fork server they are
#: forked from (``import mmseg_stag`` took 17 s a process on the H100
#: machine of 2026-11-27: MMEngine's optimizer builder imports
#: ``transformers`` there); nothing of it touches CUDA, so each arm still
#: starts CUDA afresh
PRELOAD = ['benchmarks.first_contact', 'benchmarks.stand_in_graph',
           'mmseg_stag', 'mmseg_stag.engine.runs', 'mmengine.runner',
           'mmseg.models']


def arm_process(spec_file: str, out_file: str, log_file: str) -> None:
    """An arm's process: its output to ``log_file``, its result (or its
    error and traceback) to ``out_file``."""
    import traceback
    fd = os.open(log_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    with open(spec_file) as f:
        spec = json.load(f)
    try:
        result = dict(run_arm(spec), status='ok')
    except BaseException as err:  # reported; the next arm still runs
        result = dict(status='failed', error=f'{type(err).__name__}: '
                      f'{err}\n' + tail(traceback.format_exc()))
    with open(out_file, 'w') as f:
        json.dump(result, f)


def run_arms(arms: List[Arm], make_spec, folder: str, timeout: float,
             deadline: float, save) -> Dict[str, dict]:
    """Each arm in a process of its own, forked from a server that
    imported :data:`PRELOAD` once (``make_spec(arm)``: its spec), under
    ``timeout`` seconds, none started after ``deadline`` (a
    ``time.perf_counter`` value); ``save(results)`` after each. An arm
    that fails, dies or times out is recorded with its log's tail."""
    import multiprocessing
    context = multiprocessing.get_context('forkserver')
    context.set_forkserver_preload(PRELOAD)
    results: Dict[str, dict] = {}
    for i, arm in enumerate(arms):
        if time.perf_counter() > deadline:
            results[arm.name] = dict(status='skipped', error='the check\'s '
                                     'time budget was spent before it')
            save(results)
            continue
        spec = make_spec(arm)
        files = [osp.join(folder, f'arm{i}{end}') for end in
                 ('.json', '_result.json', '.log')]
        with open(files[0], 'w') as f:
            json.dump(spec, f)
        print(f'[first-contact] {arm.name}: {arm.config}, '
              f'{arm.images} images a condition', flush=True)
        t0 = time.perf_counter()
        proc = context.Process(target=arm_process, args=files)
        proc.start()
        proc.join(timeout)
        if proc.is_alive():
            proc.kill()
            proc.join()
            result = dict(status='failed', error=f'timed out after '
                          f'{timeout:.0f} s')
        elif osp.isfile(files[1]):
            with open(files[1]) as f:
                result = json.load(f)
        else:
            result = dict(status='failed', error=f'the process died (exit '
                          f'code {proc.exitcode})')
        if result['status'] != 'ok' and osp.isfile(files[2]):
            with open(files[2], errors='replace') as f:
                result['log'] = tail(f.read())
        result.update(arm=dataclasses.asdict(arm), weights=spec['weights'],
                      seconds=round(time.perf_counter() - t0, 1))
        results[arm.name] = result
        print(f"[first-contact] {arm.name}: {result['status']} in "
              f"{result['seconds']} s", flush=True)
        save(results)
    return results


def tail(text: str, lines: int = 25) -> str:
    return '\n'.join(text.strip().splitlines()[-lines:])


def relative(a: float, b: float) -> float:
    return abs(a - b) / max(abs(b), 1e-12)


def compare(comparison: Comparison, results: Dict[str, dict],
            source: Dict[str, 'object']) -> dict:
    """``comparison``'s graph arm against its eager arm: the worst per-step
    loss difference (relative), the weight update's (``‖Δg − Δe‖ / ‖Δe‖``,
    Δ: adapted − ``source``), the worst stage score difference, and the
    graph's captures and replays; ``passed`` against :data:`TOLERANCES`
    (None for the noise floor)."""
    import torch
    g, e = results.get(comparison.graph), results.get(comparison.eager)
    out = dict(name=comparison.name, graph=comparison.graph,
               eager=comparison.eager, kind=comparison.kind)
    if not g or not e or g.get('status') != 'ok' or e.get('status') != 'ok':
        return dict(out, passed=False, why='an arm did not run')
    why = []
    worst = None
    for key in sorted(set(g['losses']) | set(e['losses'])):
        a, b = g['losses'].get(key, []), e['losses'].get(key, [])
        if len(a) != len(b):
            why.append(f'{key}: {len(a)} steps against {len(b)}')
            continue
        for step, (x, y) in enumerate(zip(a, b)):
            if not (math.isfinite(x) and math.isfinite(y)):
                why.append(f'{key} step {step}: not finite ({x}, {y})')
            elif worst is None or relative(x, y) > worst['rel']:
                worst = dict(key=key, step=step, rel=relative(x, y),
                             graph=x, eager=y)
    out['loss'] = worst
    ga, ea = torch.load(g['weights']), torch.load(e['weights'])
    if set(ga) != set(ea):
        why.append('other adapted tensors')
    diff = change = 0.0
    for name in ea:
        if name in ga and name in source:
            base = source[name].float()
            diff += float((ga[name] - ea[name]).double().pow(2).sum())
            change += float((ea[name] - base).double().pow(2).sum())
    out['update'] = dict(rel=math.sqrt(diff / change) if change else None,
                         eager_norm=math.sqrt(change),
                         tensors=len(ea))
    scores = list(zip(g['scores'], e['scores']))
    out['score_abs'] = max((abs(x - y) for x, y in scores), default=None)
    out['counts'] = {k: g.get(k) for k in ('captures', 'replays',
                                           'replays_on_new', 'eager_steps')}
    if comparison.kind == 'noise':
        return dict(out, passed=None, why='; '.join(why) or None)
    tol = TOLERANCES
    if worst is not None and worst['rel'] > tol['loss_rel']:
        why.append(f"{worst['key']} at step {worst['step']} differs by "
                   f"{100 * worst['rel']:.2f} % (> {100 * tol['loss_rel']:g})")
    rel = out['update']['rel']
    if ea and (rel is None or change == 0):
        why.append('the eager arm changed no adapted value')
    elif rel is not None and rel > tol['update_rel']:
        why.append(f'weight update differs by {100 * rel:.1f} % '
                   f"(> {100 * tol['update_rel']:g})")
    if out['score_abs'] is not None and out['score_abs'] > tol['score_abs']:
        why.append(f"a stage's mIoU differs by {out['score_abs']:.2f} "
                   f"points (> {tol['score_abs']:g})")
    if g.get('captures', 0) < 1:
        why.append('the graph arm captured no graph')
    elif g.get('replays_on_new', 0) < 1:
        why.append('no replay stepped on a batch other than the captured '
                   'one')
    out['waits'] = {}
    for role, arm in (('graph', g), ('eager', e)):
        if arm.get('waits') is None:  # not recorded (the CPU)
            continue
        inside = waits_inside_stages(arm['waits'], SETTLING_BATCHES)
        out['waits'][role] = len(inside)
        if inside:
            why.append(f"the {role} arm waited for the GPU {len(inside)} "
                       f"times inside a stage (first: batch "
                       f"{inside[0]['batch']}, {inside[0]['site']})")
    if g.get('num_updates') != e.get('num_updates'):
        why.append(f"{g.get('num_updates')} updates against "
                   f"{e.get('num_updates')}")
    return dict(out, passed=not why, why='; '.join(why) or None)


def verdict(comparisons: List[dict]) -> bool:
    return all(c['passed'] for c in comparisons if c['kind'] != 'noise')


def markdown(report: dict) -> str:
    """The report as a page: the verdict, the comparisons, the arms."""
    env = report['environment']
    lines = [
        '# First contact: is the fast path right?', '',
        f"`{report['command']}` at commit {report['code'].get('describe')}"
        f" ({report['code'].get('commit')}), {env.get('date')}, on "
        f"{env.get('gpu') or env.get('device')} (torch {env.get('torch')}, "
        f"CUDA {env.get('cuda_runtime')}).", '',
        f"**Verdict: {'PASS' if report['passed'] else 'FAIL'}** "
        f"({report['minutes']:.1f} min). Tolerances (bfloat16): a step's "
        f"loss {100 * TOLERANCES['loss_rel']:g} %, the weight update "
        f"{100 * TOLERANCES['update_rel']:g} %, a stage's mIoU "
        f"{TOLERANCES['score_abs']:g} point; learning rate {CHECK_LR:g} in "
        'every arm that updates. Waits: the calls that made the host wait '
        "for the GPU (CUDA's sync debug mode) in a stage's batches after "
        f'the first {SETTLING_BATCHES} of the run, stage ends aside: a '
        'fault.' + (' **A stand-in graph on the CPU: '
                                     'nothing measured.**' if report.get(
                                         'stand_in') else ''), '',
        '| comparison | verdict | worst loss Δ (step) | update Δ | '
        'mIoU Δ | captures | replays (on new batches) | waits inside a '
        'stage (graph, eager) | why |',
        '|---|---|---|---|---|---|---|---|---|']
    for c in report['comparisons']:
        loss = c.get('loss')
        upd = (c.get('update') or {}).get('rel')
        counts = c.get('counts') or {}
        mark = {True: 'pass', False: 'FAIL', None: 'noise floor'}[c['passed']]
        lines.append(
            f"| {c['name']} | {mark} | "
            + (f"{100 * loss['rel']:.3f} % ({loss['step']})" if loss else '—')
            + ' | ' + (f'{100 * upd:.2f} %' if upd is not None else '—')
            + ' | ' + (f"{c['score_abs']:.2f}" if c.get('score_abs')
                       is not None else '—')
            + f" | {counts.get('captures', '—')} | "
            f"{counts.get('replays', '—')} "
            f"({counts.get('replays_on_new', '—')})"
            f" | {waits_cell(c.get('waits'))} | {c.get('why') or ''} |")
    lines += ['', '| arm | config | status | images | images/s (whole '
              'loop) | peak memory (MiB) | seconds (process) |',
              '|---|---|---|---|---|---|---|']
    for name, r in report['arms'].items():
        cfg = (r.get('arm') or {}).get('config', '')
        ips, mem = r.get('images_per_s'), r.get('peak_memory_mib')
        lines.append(
            f"| {name} | `{cfg}` | {r['status']} | {r.get('images', '—')} | "
            + (f'{ips:.2f}' if ips else '—') + ' | '
            + (f'{mem:.0f}' if mem else '—') + f" | {r.get('seconds', '—')} |")
    failed = {n: r for n, r in report['arms'].items()
              if r['status'] != 'ok'}
    for name, r in failed.items():
        lines += ['', f'## {name}: {r["status"]}', '', '```',
                  r.get('error') or '', r.get('log') or '', '```']
    return '\n'.join(lines) + '\n'


def waits_cell(waits: Optional[dict]) -> str:
    if not waits:
        return '—'
    return ', '.join(str(waits.get(role, '—')) for role in ('graph',
                                                             'eager'))


def write(report: dict, out_dir: str) -> str:
    """``first_contact.{json,md}`` in ``out_dir``; their path without the
    extension."""
    os.makedirs(out_dir, exist_ok=True)
    base = osp.join(out_dir, 'first_contact')
    with open(base + '.json', 'w') as f:
        json.dump(report, f, indent=1, default=str)
    with open(base + '.md', 'w') as f:
        f.write(markdown(report))
    return base
