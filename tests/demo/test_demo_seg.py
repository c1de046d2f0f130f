"""The offline segmentation demo (``tools/demo.py``), reduced: the stand-in
benchmark, a trained source model and the online runs through the same
scripts, end to end."""
import json

import tool_runs
from recorded import (ENV, REPO, check_or_record, reduced_command,
                      reduced_numbers)


def test_reduced_demo_end_to_end(tmp_path):
    """The demo script itself, tiny (``recorded.REDUCED['seg']``): 64x32
    images, 5 training iterations, 2 rounds, four methods (Hybrid-TTA+STAG,
    make demo-hybrid's, too), one beta0 candidate, on the pinned kernel
    paths."""
    work = tmp_path / 'demo'
    proc = tool_runs.run(reduced_command('seg', work, extra=['--realtime']),
                         capture_output=True, text=True, cwd=REPO, env=ENV)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = json.loads((work / 'demo_summary.json').read_text())
    methods = ('source', 'tent', 'tent-stag', 'hybrid-tta-stag')
    assert set(summary['methods']) == set(methods)
    assert summary['betas'] == {'tent-stag': 100.0, 'hybrid-tta-stag': 100.0}
    for method in methods:
        stages = summary['methods'][method]['stages']
        assert len(stages) == 8
        assert (work / method / 'continual_results.csv').is_file()
        assert (work / method / 'continual_miou.png').is_file()
        segmaps = list((work / method / 'segmaps').rglob('*.png'))
        # the last round's map of each condition's last image
        assert len(segmaps) == 4
    import torch
    torch.load(work / 'source_model.pth', weights_only=True)
    assert '| tent-stag (beta0=100) |' in proc.stdout
    assert 'round 2' in (work / 'demo_summary.md').read_text()
    assert (work / 'demo_comparison.png').stat().st_size > 0
    comparison = json.loads((work / 'demo_comparison.json').read_text())
    assert [r['name'] for r in comparison['runs']] == \
        ['source', 'tent', 'tent-stag (beta0=100)',
         'hybrid-tta-stag (beta0=100)']
    assert all(r['stages_done'] == 8 for r in comparison['runs'])
    assert '[kernels] pinned' in proc.stdout
    # a clean install (constraints.txt) prints these numbers, to the digit,
    # on any x86-64 processor (the pinned kernel paths)
    check_or_record('seg', reduced_numbers('seg', work))
    check_realtime_rows(work, methods)


def check_realtime_rows(work, methods):
    """``--realtime`` (pinned): each method again with its config's cost,
    two images a stage: the second adapts only where a step costs at most
    one forward; the table beside the offline one."""
    from mmengine.config import Config
    rows = json.loads((work / 'demo_realtime.json').read_text())['methods']
    assert set(rows) == set(methods)
    for method in methods:
        cfg = Config.fromfile(f'{REPO}/configs/demo/segformer_mit-tiny_'
                              f'demo-acdc_{method}_realtime.py')
        info = rows[method]['realtime']
        assert info['cost'] == cfg.test_cfg.realtime.cost
        adapted = 8 * (2 if info['cost'] <= 1 else 1)
        assert info['batches_adapted'] == adapted, method
        assert info['batches_predicted_only'] == 16 - adapted
    assert '| realistic mIoU |' in (work / 'demo_realtime.md').read_text()
