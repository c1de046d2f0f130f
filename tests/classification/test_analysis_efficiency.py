"""Table efficiency through ``tools/analysis/efficiency.py`` on the tiny
CIFAR-C stream: passes counted in images (Source: no backward; TENT and
TENT+STAG: every image once forward and once backward), time and memory
measured, the paper's layout written."""
import json


from tools.analysis import efficiency

from test_cls_online import (CIFAR, checkpoint, killable_config,  # noqa
                             options)


def test_passes_time_memory(tmp_path, stream, names, checkpoint):
    _, root = stream
    rows = []
    for name, leaf in (('Source', 'source'), ('TENT', 'tent'),
                       ('+STAG', 'tent-stag')):
        folder = tmp_path / leaf
        folder.mkdir()
        opts = options(root, names, batch_size=8)
        if leaf == 'source':
            opts.pop('test_cfg.method.optimizer')
        rows += ['--row', name, killable_config(CIFAR.format(leaf), opts,
                                                folder, kill=False)]
    work = tmp_path / 'eff'
    table = efficiency.main([checkpoint, *rows, '--images', '24',
                             '--condition', names[1], '--work-dir',
                             str(work)])
    assert table['Source']['forward'] == 24
    assert table['Source']['backward'] == 0
    for name in ('TENT', '+STAG'):  # one forward, one backward per batch
        assert table[name]['forward'] == table[name]['backward'] == 24
        assert table[name]['backward_passes'] == 3
    for r in table.values():
        assert r['images'] == 24 and r['time_s'] > 0 and r['memory_mb'] > 0
    saved = json.load(open(work / 'efficiency.json'))
    assert saved['rows'] == table and saved['device']
    text = open(work / 'efficiency.txt').read().splitlines()
    assert text[1].split() == ['Method', 'Forward', 'Backward', 'Time',
                               '(s)', 'Memory', '(MB)']
    assert text[2].split()[:3] == ['Source', '24', 'N/A']
    assert (work / 'efficiency.png').stat().st_size > 10000
    res = json.load(open(work / 'TENT' / 'continual_results.json'))
    assert [s['condition'] for s in res['stages']] == [names[1]]
