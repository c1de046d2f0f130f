"""tools/select_beta.py: beta0 chosen on round-1 fog alone, on the tiny
stream through tools/test.py's run (in process)."""
import json
import os.path as osp

import pytest
from seg_helpers import REPO, SEG_CFG, as_cli, tiny_options


def test_chooses_the_best_round_one_fog_miou(tiny_acdc, tiny_checkpoint,
                                             tmp_path, capsys, load_tool):
    select_beta = load_tool('select_beta')
    opts = tiny_options(tiny_acdc)
    cli = ['--cfg-options'] + as_cli(opts)
    result = select_beta.main(
        [osp.join(REPO, SEG_CFG.format('tent-stag')), tiny_checkpoint,
         '--beta-grid', '1', '5000', '--work-dir', str(tmp_path)] + cli)
    scores = {t['beta0']: t['score'] for t in result['trials']}
    assert set(scores) == {1.0, 5000.0}
    assert result['beta0'] == max(scores, key=lambda b: (scores[b], -b))
    assert result['gamma'] == 35.0  # the config's
    for beta0 in ('1', '5000'):  # one fog stage of round 1 per run
        with open(tmp_path / f'beta0_{beta0}_gamma_35' /
                  'continual_results.json') as f:
            stages = json.load(f)['stages']
        assert [(s['round'], s['condition']) for s in stages] == [(1, 'fog')]
        assert stages[0]['score'] == pytest.approx(scores[float(beta0)])
    with open(tmp_path / 'beta_selection.json') as f:
        assert json.load(f)['beta0'] == result['beta0']
    out = capsys.readouterr().out
    assert f"test_cfg.method.stag.beta0={result['beta0']:g}" in out


def test_bad_input_stops_before_any_run(tiny_checkpoint, tmp_path,
                                        load_tool):
    select_beta = load_tool('select_beta')
    with pytest.raises(SystemExit, match='has no test_cfg.method.stag'):
        select_beta.main([osp.join(REPO, SEG_CFG.format('tent')),
                          tiny_checkpoint, '--work-dir', str(tmp_path)])
    with pytest.raises(SystemExit, match='checkpoint file not found'):
        select_beta.main([osp.join(REPO, SEG_CFG.format('tent-stag')),
                          str(tmp_path / 'none.pth'), '--work-dir',
                          str(tmp_path)])
    assert list(tmp_path.iterdir()) == []
