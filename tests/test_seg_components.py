"""Dataset, metric, wrapper and NVlabs converter, each on its own."""
import filecmp
import json
import os
import os.path as osp

import numpy as np
import pytest
import torch
from conftest import build_from_config, tiny_options
from mmengine.structures import PixelData
from mmseg.structures import SegDataSample

from mmseg_stag.datasets import (CONTINUAL_META_KEYS, ACDCContinualDataset,
                                 make_acdc_like_tree)
from mmseg_stag.evaluation import ContinualIoUMetric
from mmseg_stag.models import convert_nvlabs_segformer
from mmseg_stag.models.nvlabs_convert import convert_nvlabs_checkpoint

CFG = 'configs/stag_acdc/segformer_mit-b5_acdc-continual_{}.py'
NVLABS_CFG = 'configs/stag_acdc/segformer_mit-b5-nvlabs_acdc-continual_{}.py'
PIPELINE = [
    dict(type='LoadImageFromFile'),
    dict(type='Resize', scale=(64, 32), keep_ratio=True),
    dict(type='LoadAnnotations'),
    dict(type='PackSegInputs', meta_keys=CONTINUAL_META_KEYS),
]


# ---------------------------------------------------------------- dataset
def test_stream_order_tags_and_pipeline(tiny_acdc):
    from mmengine.registry import init_default_scope
    init_default_scope('mmseg')
    ds = ACDCContinualDataset(data_root=tiny_acdc, rounds=2,
                              pipeline=PIPELINE)
    assert len(ds) == 16
    infos = [ds.get_data_info(i) for i in range(16)]
    assert [i['condition'] for i in infos[:8:2]] == ['fog', 'night', 'rain',
                                                     'snow']
    assert [i['stage'] for i in infos] == [s for s in range(8)
                                           for _ in range(2)]
    assert [i['round'] for i in infos] == [1] * 8 + [2] * 8
    fog = [i['img_path'] for i in infos if i['condition'] == 'fog'][:2]
    assert fog == sorted(fog)
    assert fog[0].endswith(osp.join('rgb_anon', 'fog', 'train', 'GOPR0400',
                                    'GOPR0400_frame_000000_rgb_anon.png'))
    assert infos[0]['seg_map_path'].endswith(
        osp.join('gt', 'fog', 'train', 'GOPR0400',
                 'GOPR0400_frame_000000_gt_labelTrainIds.png'))
    sample = ds[5]
    meta = sample['data_samples'].metainfo
    assert (meta['stage'], meta['round'], meta['condition']) == (2, 1, 'rain')
    labels = set(np.unique(sample['data_samples'].gt_sem_seg.data.numpy()))
    assert labels <= set(range(19)) | {255} and 255 in labels
    assert ds.metainfo['classes'][0] == 'road' and \
        len(ds.metainfo['classes']) == 19


def test_options_conditions_split_rounds(tiny_acdc):
    ds = ACDCContinualDataset(data_root=tiny_acdc, conditions=('snow', 'fog'),
                              rounds=3)
    conds = [ds.get_data_info(i)['condition'] for i in range(len(ds))]
    assert conds == (['snow'] * 2 + ['fog'] * 2) * 3
    with pytest.raises(FileNotFoundError, match=osp.join('fog', 'val')):
        ACDCContinualDataset(data_root=tiny_acdc, split='val')
    with pytest.raises(ValueError, match='rounds'):
        ACDCContinualDataset(data_root=tiny_acdc, rounds=0)


def test_empty_condition_folder(tmp_path):
    root = make_acdc_like_tree(str(tmp_path / 'a'), images_per_condition=1)
    folder = osp.join(root, 'rgb_anon', 'snow', 'train')
    for dirpath, _, names in os.walk(folder):
        for n in names:
            os.remove(osp.join(dirpath, n))
    with pytest.raises(FileNotFoundError, match='no \\*_rgb_anon.png'):
        ACDCContinualDataset(data_root=root)


def test_layout_writer_is_deterministic(tmp_path):
    a = make_acdc_like_tree(str(tmp_path / 'a'), seed=3)
    b = make_acdc_like_tree(str(tmp_path / 'b'), seed=3)
    c = make_acdc_like_tree(str(tmp_path / 'c'), seed=4)
    files = sorted(osp.relpath(osp.join(d, n), a)
                   for d, _, ns in os.walk(a) for n in ns)
    assert len(files) == 16
    assert all(filecmp.cmp(osp.join(a, f), osp.join(b, f), shallow=False)
               for f in files)
    assert not all(filecmp.cmp(osp.join(a, f), osp.join(c, f), shallow=False)
                   for f in files)


# ----------------------------------------------------------------- metric
def fake_sample(pred, label, stage, round_, condition):
    s = SegDataSample(metainfo=dict(stage=stage, round=round_,
                                    condition=condition,
                                    img_path=f'{condition}{stage}.png'))
    s.pred_sem_seg = PixelData(data=torch.as_tensor(pred)[None])
    s.gt_sem_seg = PixelData(data=torch.as_tensor(label)[None])
    return s.to_dict()


def reference_miou(pairs, num_classes=19):
    conf = np.zeros((num_classes, num_classes))
    for pred, label in pairs:
        valid = label != 255
        np.add.at(conf, (label[valid], pred[valid]), 1)
    inter = np.diag(conf)
    union = conf.sum(0) + conf.sum(1) - inter
    iou = np.where(union > 0, inter / np.maximum(union, 1), np.nan)
    return float(np.nanmean(iou) * 100)


def test_metric_accumulates_per_stage(tmp_path):
    rng = np.random.default_rng(0)
    metric = ContinualIoUMetric(output_dir=str(tmp_path))
    stream, expected = [], {}
    for stage, (round_, cond) in enumerate([(1, 'fog'), (1, 'night'),
                                            (2, 'fog'), (2, 'night')]):
        pairs = []
        for _ in range(3):
            label = rng.integers(0, 4 + stage, size=(6, 7))
            label[0, :3] = 255
            pred = np.where(rng.random((6, 7)) < .7, label,
                            rng.integers(0, 6, size=(6, 7)))
            pred[pred == 255] = 0
            pairs.append((pred, label))
            stream.append(fake_sample(pred, label, stage, round_, cond))
        expected[stage] = reference_miou(pairs)
    for i in range(0, len(stream), 2):
        metric.process({}, stream[i:i + 2])
    assert (tmp_path / 'continual_results.partial.jsonl').read_text().count(
        '\n') == 3  # three stages finished before the end
    results = metric.compute_metrics(metric.results)
    data = json.loads((tmp_path / 'continual_results.json').read_text())
    got = {s['stage']: s['mIoU'] for s in data['stages']}
    assert got == pytest.approx(expected)
    assert results['mIoU'] == pytest.approx(np.mean(list(expected.values())))
    assert data['mean_mIoU'] == pytest.approx(results['mIoU'])
    assert results['r2_night'] == pytest.approx(expected[3], abs=0.01)
    # a class absent from gt and prediction of a stage is null, not 0
    assert data['stages'][0]['per_class_IoU']['bicycle'] is None
    assert (tmp_path / 'continual_miou.png').stat().st_size > 1000


def test_metric_needs_stage_tags():
    metric = ContinualIoUMetric()
    sample = fake_sample(np.zeros((2, 2), int), np.zeros((2, 2), int), 0, 1,
                         'fog')
    del sample['stage']
    with pytest.raises(KeyError, match='meta_keys'):
        metric.process({}, [sample])


# ---------------------------------------------------------------- wrapper
@pytest.mark.parametrize('config', [CFG, NVLABS_CFG])
@pytest.mark.parametrize('mode', ['whole', 'slide'])
def test_wrapper_outputs_and_predictions(config, mode, tiny_acdc):
    head = 'nvlabs' if 'nvlabs' in config else 'mmseg'
    opts = tiny_options(tiny_acdc, head=head)
    if mode == 'slide':
        opts['model.test_cfg'] = dict(mode='slide', crop_size=(32, 32),
                                      stride=(24, 24))
    model, _ = build_from_config(config.format('tent'), opts)
    model.eval()
    inputs = torch.randn(1, 3, 32, 64)
    metas = [dict(ori_shape=(32, 64), img_shape=(32, 64), pad_shape=(32, 64),
                  padding_size=[0, 0, 0, 0])]
    calls = []
    head_forward = model.decode_head.forward
    model.decode_head.forward = lambda x: calls.append(1) or head_forward(x)
    with torch.enable_grad():
        seg_logits, outs = model.inference_with_features(inputs, metas)
    n_crops = 1 if mode == 'whole' else 3  # 64 wide, crops 32, stride 24
    assert len(outs) == n_crops and len(calls) == n_crops
    for feats, logits in outs:
        assert feats.shape[1] == model.classifier.in_channels
        # the head's own resolution: 1/4 of the (crop) input
        assert feats.shape[2:] == logits.shape[2:] == (
            (8, 16) if mode == 'whole' else (8, 8))
        torch.testing.assert_close(model.classifier(feats), logits)
        assert logits.requires_grad
    with torch.no_grad():
        plain = model.inference(inputs, metas)
    torch.testing.assert_close(seg_logits.detach(), plain)


# -------------------------------------------------------------- converter
def nvlabs_state_dict(model):
    """An NVlabs-layout state dict with the shapes of ``model`` (MiT +
    NVSegformerHead), with random values."""
    gen = torch.Generator().manual_seed(0)
    own = model.state_dict()
    nv = {}
    bb = model.backbone
    for i, layer in enumerate(bb.layers, start=1):
        for part, new in (('proj', 'projection'), ('norm', 'norm')):
            for p in ('weight', 'bias'):
                nv[f'backbone.patch_embed{i}.{part}.{p}'] = own[
                    f'backbone.layers.{i-1}.0.{new}.{p}']
        for j in range(len(layer[1])):
            pre = f'backbone.layers.{i-1}.1.{j}.'
            dim = own[pre + 'norm1.weight'].shape[0]
            hidden = own[pre + 'ffn.layers.0.weight'].shape[0]
            blk = f'backbone.block{i}.{j}.'
            nv[blk + 'attn.q.weight'] = torch.randn(dim, dim, generator=gen)
            nv[blk + 'attn.q.bias'] = torch.randn(dim, generator=gen)
            nv[blk + 'attn.kv.weight'] = torch.randn(2 * dim, dim,
                                                     generator=gen)
            nv[blk + 'attn.kv.bias'] = torch.randn(2 * dim, generator=gen)
            nv[blk + 'attn.proj.weight'] = torch.randn(dim, dim,
                                                       generator=gen)
            nv[blk + 'attn.proj.bias'] = torch.randn(dim, generator=gen)
            for name in ('norm1', 'norm2', 'attn.sr', 'attn.norm'):
                for p in ('weight', 'bias'):
                    if pre + f'{name}.{p}' in own:
                        nv[blk + f'{name}.{p}'] = torch.randn(
                            own[pre + f'{name}.{p}'].shape, generator=gen)
            nv[blk + 'mlp.fc1.weight'] = torch.randn(hidden, dim,
                                                     generator=gen)
            nv[blk + 'mlp.fc1.bias'] = torch.randn(hidden, generator=gen)
            nv[blk + 'mlp.dwconv.dwconv.weight'] = torch.randn(
                hidden, 1, 3, 3, generator=gen)
            nv[blk + 'mlp.dwconv.dwconv.bias'] = torch.randn(hidden,
                                                             generator=gen)
            nv[blk + 'mlp.fc2.weight'] = torch.randn(dim, hidden,
                                                     generator=gen)
            nv[blk + 'mlp.fc2.bias'] = torch.randn(dim, generator=gen)
        for p in ('weight', 'bias'):
            nv[f'backbone.norm{i}.{p}'] = own[f'backbone.layers.{i-1}.2.{p}']
    for key, value in own.items():
        if key.startswith('decode_head.'):
            nv[key.replace('conv_seg', 'linear_pred')] = torch.randn(
                value.shape, generator=gen) if value.is_floating_point() \
                else value
    return nv


def test_converter_strict_load_and_values(tiny_acdc, tmp_path):
    model, _ = build_from_config(NVLABS_CFG.format('tent'),
                                 tiny_options(tiny_acdc, head='nvlabs'))
    nv = nvlabs_state_dict(model)
    converted = convert_nvlabs_segformer(nv)
    result = model.load_state_dict(converted, strict=True)
    assert not result.missing_keys and not result.unexpected_keys
    blk = 'backbone.layers.1.1.0.'
    torch.testing.assert_close(
        converted[blk + 'attn.attn.in_proj_weight'],
        torch.cat([nv['backbone.block2.0.attn.q.weight'],
                   nv['backbone.block2.0.attn.kv.weight']]))
    torch.testing.assert_close(
        converted[blk + 'ffn.layers.0.weight'][:, :, 0, 0],
        nv['backbone.block2.0.mlp.fc1.weight'])
    torch.testing.assert_close(converted['decode_head.conv_seg.weight'],
                               nv['decode_head.linear_pred.weight'])
    # the file converter writes a weights_only-loadable checkpoint
    src, dst = tmp_path / 'nv.pth', tmp_path / 'mm.pth'
    torch.save({'state_dict': nv, 'meta': {'iter': 160000}}, src)
    assert convert_nvlabs_checkpoint(str(src), str(dst)) == len(converted)
    saved = torch.load(dst, weights_only=True)
    assert set(saved['state_dict']) == set(converted)
    with pytest.raises(ValueError, match='backbone.block1.0.attn.qq.weight'):
        convert_nvlabs_segformer(dict(nv, **{
            'backbone.block1.0.attn.qq.weight': torch.zeros(1)}))


def test_config_meta_keys_match_the_constant():
    from mmengine.config import Config
    from conftest import REPO
    cfg = Config.fromfile(osp.join(
        REPO, 'configs/_base_/datasets/acdc_continual.py'))
    assert tuple(cfg.continual_meta_keys) == CONTINUAL_META_KEYS
