"""Safe checkpoint loading, strict matching and publishing."""
import numpy as np
import pytest
import torch
import torch.nn as nn
from mmengine.logging import HistoryBuffer

from mmseg_stag.checkpoint import (load_checkpoint_file,
                                   load_segmentor_checkpoint,
                                   published_checkpoint)


class TinyHeadModel(nn.Module):

    def __init__(self, num_classes=4):
        super().__init__()
        self.backbone = nn.Conv2d(3, 8, 3)
        self.decode_head = nn.Module()
        self.decode_head.conv_seg = nn.Conv2d(8, num_classes, 1)


def runner_style_checkpoint(model):
    """What MMEngine's Runner saves: tensors plus objects in meta."""
    return {
        'meta': {'iter': 10, 'seed': np.int64(3),
                 'message_hub': {'loss': HistoryBuffer([1.0, 2.0], [1, 1])}},
        'state_dict': model.state_dict(),
    }


def test_plain_checkpoint_loads_strictly(tmp_path):
    src = TinyHeadModel()
    path = tmp_path / 'plain.pth'
    torch.save({'state_dict': src.state_dict(), 'meta': {'iter': 5}}, path)
    dst = TinyHeadModel()
    meta = load_segmentor_checkpoint(dst, str(path))
    assert meta == {'iter': 5}
    for k, v in src.state_dict().items():
        assert torch.equal(dst.state_dict()[k], v)
    # a bare state dict with DDP's prefix is fine too
    torch.save({f'module.{k}': v for k, v in src.state_dict().items()},
               tmp_path / 'bare.pth')
    load_segmentor_checkpoint(TinyHeadModel(), str(tmp_path / 'bare.pth'))


def test_legacy_pickle_refused_without_opt_in(tmp_path):
    model = TinyHeadModel()
    path = tmp_path / 'runner.pth'
    torch.save(runner_style_checkpoint(model), path)
    with pytest.raises(RuntimeError) as err:
        load_checkpoint_file(str(path))
    assert str(path) in str(err.value)
    assert '--trust-pickle' in str(err.value)
    assert 'allow_unsafe_pickle=True' in str(err.value)
    ckpt = load_checkpoint_file(str(path), allow_unsafe_pickle=True)
    assert isinstance(ckpt['meta']['message_hub']['loss'], HistoryBuffer)


def test_publish_makes_a_safe_checkpoint(tmp_path, load_tool, monkeypatch,
                                         capsys):
    model = TinyHeadModel()
    src = tmp_path / 'runner.pth'
    dst = tmp_path / 'published' / 'published.pth'  # its folder: made
    torch.save(runner_style_checkpoint(model), src)
    with pytest.raises(RuntimeError, match='trust-pickle'):
        published_checkpoint(str(src))
    tool = load_tool('publish_checkpoint')
    monkeypatch.setattr('sys.argv', ['publish_checkpoint.py', str(src),
                                     str(dst), '--trust-pickle'])
    tool.main()
    assert f'published {len(model.state_dict())} tensors' in \
        capsys.readouterr().out
    assert [p.name for p in dst.parent.iterdir()] == ['published.pth']
    safe = torch.load(dst, weights_only=True)
    assert safe['meta']['iter'] == 10 and safe['meta']['seed'] == 3
    load_segmentor_checkpoint(TinyHeadModel(), str(dst))


def test_missing_file_and_mismatches_name_the_problem(tmp_path):
    with pytest.raises(FileNotFoundError, match='nope.pth'):
        load_checkpoint_file(str(tmp_path / 'nope.pth'))
    path = tmp_path / 'c150.pth'
    torch.save({'state_dict': TinyHeadModel(num_classes=6).state_dict()},
               path)
    with pytest.raises(ValueError, match=r"decode_head.conv_seg.weight.*6 vs "
                       r'4 classes'):
        load_segmentor_checkpoint(TinyHeadModel(num_classes=4), str(path))

    state = TinyHeadModel().state_dict()
    state['decode_head.extra.weight'] = torch.zeros(1)
    del state['backbone.bias']
    torch.save({'state_dict': state}, tmp_path / 'keys.pth')
    with pytest.raises(ValueError) as err:
        load_segmentor_checkpoint(TinyHeadModel(), str(tmp_path / 'keys.pth'))
    assert 'missing keys (1): backbone.bias' in str(err.value)
    assert 'unexpected keys (1): decode_head.extra.weight' in str(err.value)
    assert 'keys.pth does not match the model built by the config' in \
        str(err.value)
    state = TinyHeadModel().state_dict()
    state['backbone.weight'] = torch.zeros(8, 3, 1, 1)
    torch.save({'state_dict': state}, tmp_path / 'shape.pth')
    with pytest.raises(ValueError, match=r'shape mismatches: backbone\.weight:'
                       r' file \(8, 3, 1, 1\) vs model \(8, 3, 3, 3\)'):
        load_segmentor_checkpoint(TinyHeadModel(), str(tmp_path / 'shape.pth'))

    head_less = {k: v for k, v in TinyHeadModel().state_dict().items()
                 if 'conv_seg' not in k}
    head_less['decode_head.linear_pred.weight'] = torch.zeros(4, 8, 1, 1)
    torch.save({'state_dict': head_less}, tmp_path / 'nvlabs.pth')
    with pytest.raises(ValueError, match='convert_nvlabs_segformer'):
        load_segmentor_checkpoint(TinyHeadModel(),
                                  str(tmp_path / 'nvlabs.pth'))
