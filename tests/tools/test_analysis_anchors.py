"""Figure structural_anchor: the three numbers against a hand computation
on a 3-class classifier, and the command on tiny real configs (a
classification CNN and the demo SegFormer) with its files and errors."""
import json
import math
import os.path as osp

import numpy as np
import pytest
import torch
from tool_runs import tool_module

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
# the figure's numbers are the tool's (tools/analysis/anchor_validation.py)
_TOOL = tool_module('analysis/anchor_validation')
anchor_validation = _TOOL.anchor_validation
assignment_matrix = _TOOL.assignment_matrix
heatmap_classes = _TOOL.heatmap_classes


@pytest.fixture
def tool(load_tool):
    """The command tools/analysis/anchor_validation.py, loaded by its path."""
    return load_tool('analysis/anchor_validation')


def test_three_classes_by_hand():
    """W = rows (2,0), (0,1), (1,1), b = (0, 0, -1): Z_kj = w_j.w_k + b_j
    = [[4,0,1],[0,1,0],[2,1,1]] (eq:inter-class_matrix); class 2's own
    vector is assigned to class 0, so 2 of 3 classes are structurally
    correct."""
    w = torch.tensor([[2., 0.], [0., 1.], [1., 1.]])
    b = torch.tensor([0., 0., -1.])
    z = np.array([[4., 0., 1.], [0., 1., 0.], [2., 1., 1.]])
    p = np.exp(z) / np.exp(z).sum(1, keepdims=True)
    np.testing.assert_allclose(assignment_matrix(w, b).numpy(), p,
                               rtol=1e-12)
    res = anchor_validation(w, b)
    h = -(p * np.log(p)).sum(1)
    assert res['self_entropy'] == pytest.approx(h.mean(), rel=1e-12)
    assert res['mdp'] == pytest.approx(np.mean([p[0, 0], p[1, 1], p[2, 2]]),
                                       rel=1e-12)
    assert res['structural_accuracy'] == pytest.approx(200 / 3)
    assert res['num_classes'] == 3
    # no bias; a confident orthogonal classifier is 100 % structurally
    # correct with psi near 1 and H near 0
    res = anchor_validation(10 * torch.eye(4))
    assert res['structural_accuracy'] == 100
    assert res['mdp'] > 0.999 and res['self_entropy'] < 1e-3
    assert res['self_entropy'] >= 0 and not math.isnan(res['mdp'])


@pytest.mark.parametrize(
    'device', ['cpu', pytest.param('cuda', marks=pytest.mark.cuda)])
def test_numbers_on_the_classifier_device(device):
    """The class indices are made on the classifier's device: under
    another default device ('meta') or on CUDA, the same numbers."""
    torch.manual_seed(0)
    w, b = torch.randn(6, 4), torch.randn(6)
    expected = anchor_validation(w, b)
    with torch.device('meta'):  # factory calls default elsewhere
        assert anchor_validation(w.to(device), b.to(device)) == \
            pytest.approx(expected)


def test_heatmap_classes():
    assert heatmap_classes(1000, 20)[:3] == [0, 53, 105]
    assert heatmap_classes(1000, 20)[-1] == 999
    assert heatmap_classes(10, 10) == list(range(10))
    with pytest.raises(ValueError, match='--heatmap-classes 10'):
        heatmap_classes(10, 20)


@pytest.fixture
def cnn(tmp_path):
    from mmseg_stag.classification import SmallCNN
    torch.manual_seed(0)
    path = str(tmp_path / 'cnn.pth')
    torch.save({'state_dict': SmallCNN(num_classes=4, width=4).state_dict()},
               path)
    config = tmp_path / 'cnn.py'
    config.write_text(
        "_base_ = ['" + osp.join(REPO, 'configs/cls/demo/_base_/models/'
                                 'cnn-bn.py') + "']\n"
        "model = dict(network=dict(num_classes=4, width=4))\n"
        "default_scope = 'mmseg_stag'\n")
    return str(config), path


def test_command_writes_the_figure_and_numbers(tmp_path, cnn,
                                               tiny_checkpoint, tool):
    from seg_helpers import SEG_CFG, TINY_IN_CHANNELS, TINY_MIT
    seg_cfg = tmp_path / 'seg.py'  # the tiny checkpoint's config
    seg_cfg.write_text(
        f"_base_ = [{osp.join(REPO, SEG_CFG.format('source'))!r}]\n"
        f"model = dict(backbone={TINY_MIT!r}, decode_head=dict("
        f"in_channels={TINY_IN_CHANNELS!r}, channels=16))\n")
    out = tmp_path / 'out'
    res = tool.main(['--model', 'CNN', *cnn, '--model', 'SegFormer',
                     str(seg_cfg), tiny_checkpoint, '--heatmap-classes', '4',
                     '--out', str(out)])
    saved = json.load(open(out / 'structural_anchor.json'))
    assert saved['models'] == res and set(res) == {'CNN', 'SegFormer'}
    assert res['CNN']['num_classes'] == 4 and res['SegFormer'][
        'num_classes'] == 19
    heat = np.array(saved['heatmap'])
    assert heat.shape == (4, 4)
    np.testing.assert_allclose(heat.sum(1) <= 1 + 1e-9, True)
    ckpt = torch.load(cnn[1], weights_only=True)['state_dict']
    direct = anchor_validation(ckpt['fc.weight'], ckpt['fc.bias'])
    assert res['CNN'] == pytest.approx(direct)
    rows = open(out / 'structural_anchor.csv').read().splitlines()
    assert rows[0].startswith('model,self_entropy') and len(rows) == 3
    assert (out / 'structural_anchor.png').stat().st_size > 10000


def test_command_errors(tmp_path, cnn, tool):
    with pytest.raises(ValueError, match='--heatmap-classes 4'):
        tool.main(['--model', 'CNN', *cnn, '--out', str(tmp_path)])
    with pytest.raises(SystemExit):
        tool.main(['--model', 'CNN', cnn[0], str(tmp_path / 'none.pth')])
    no_linear = tmp_path / 'nolinear.py'
    no_linear.write_text(
        "model = dict(type='OnlineClassifier', network=dict(type="
        "'SmallCNN', num_classes=4, width=4))\n"
        "test_cfg = dict(head_layer='features.0')\n"
        "default_scope = 'mmseg_stag'\n")
    with pytest.raises(ValueError, match='--model X'):
        tool.main(['--model', 'X', str(no_linear), cnn[1],
                   '--heatmap-classes', '4', '--out', str(tmp_path)])
