"""Test-stream scenarios: label shift, mild (per corruption), mixed and
continual, all seeded; the stream dataset and its
stage-aligned batches."""
import numpy as np
import pytest
import torch

from mmseg_stag.classification import build_stream


def parts(cfg, data, seed):
    """The scenario's stages as ``(corruption, data indices, from the
    source)``: its order cut at the stages."""
    order, stages = build_stream(cfg, data, seed)
    assert [s.index for s in stages] == list(range(len(stages)))
    assert stages[-1].stop == len(order)
    return [(s.condition, order[s.start:s.stop], s.from_source)
            for s in stages]


def test_label_shift_stream_is_sorted_by_class(stream, names):
    data, _ = stream
    stages = parts(dict(type='label-shift'), data, 3)
    assert [name for name, _, _ in stages] == list(names)
    assert all(source for _, _, source in stages)
    for name, idx, _ in stages:
        np.testing.assert_array_equal(np.sort(idx), data.indices_of(name))
        labels = data.labels[idx]
        # each class forms one contiguous run (imbalance ratio inf)
        runs = labels[np.r_[True, labels[1:] != labels[:-1]]]
        assert len(runs) == len(set(labels.tolist()))
    again = parts(dict(type='label-shift'), data, 3)
    np.testing.assert_array_equal(stages[0][1], again[0][1])
    plain = parts(dict(type='label-shift', shuffle_class_order=False),
                  data, 3)
    lab = data.labels[plain[0][1]]
    assert np.all(np.diff(lab) >= 0)


def test_mild_and_mixed_streams_are_seeded_shuffles(stream, names):
    data, _ = stream
    a = parts(dict(type='mild'), data, seed=1)
    b = parts(dict(type='mild'), data, seed=1)
    c = parts(dict(type='mild'), data, seed=2)
    flat = [idx for _, idx, _ in a]
    assert all(np.array_equal(x, y[1]) for x, y in zip(flat, b))
    assert not np.array_equal(flat[0], c[0][1])
    assert not np.array_equal(flat[0], data.indices_of(names[0]))
    mixed = parts(dict(type='mixed'), data, seed=1)
    assert len(mixed) == 1 and mixed[0][0] == 'mixed'
    idx = mixed[0][1]
    np.testing.assert_array_equal(np.sort(idx), np.arange(len(data)))
    # corruptions are interleaved, not in blocks
    assert len(set(data.domain[idx[:20]].tolist())) > 1
    again = parts(dict(type='mixed'), data, seed=1)
    np.testing.assert_array_equal(idx, again[0][1])


def test_continual_and_mild_streams(stream, names):
    data, _ = stream
    cont = parts(dict(type='continual'), data, 0)
    assert [name for name, _, _ in cont] == list(names)
    assert [source for _, _, source in cont] == [True, False, False]
    np.testing.assert_array_equal(cont[1][1], data.indices_of(names[1]))
    mild = parts(dict(type='mild'), data, 0)
    assert all(source for _, _, source in mild)


def test_stream_dataset_stages_and_stage_aligned_batches(stream, names):
    from mmengine.dataset import DefaultSampler

    from mmseg_stag.classification import CorruptionStream, StageBatchSampler
    from mmseg_stag.engine.stream import StreamStage
    _, root = stream
    ds = CorruptionStream(dict(type='CIFARC', data_root=root),
                          corruptions=names, scenario=dict(type='mild'),
                          shuffle_seed=1)
    stages = parts(dict(type='mild'), ds.data, 1)
    assert len(ds) == 120
    assert ds.stream_stages() == [
        StreamStage(k, 1, name, 40 * k, 40 * (k + 1), from_source=True)
        for k, name in enumerate(names)]
    item = ds[41]  # the second image of the second stage
    meta = item['data_samples'].metainfo
    assert meta['corruption'] == names[1]
    image, label, _ = ds.data.item(int(stages[1][1][1]))
    assert meta['gt_label'] == label and torch.equal(item['inputs'], image)
    batches = list(StageBatchSampler(DefaultSampler(ds, shuffle=False), 16))
    # 40 images per stage: 16, 16, 8, never across a stage boundary
    assert [len(b) for b in batches] == [16, 16, 8] * 3
    assert batches[3][0] == 40
    with pytest.raises(ValueError, match='shuffle=False'):
        StageBatchSampler(DefaultSampler(ds, shuffle=True), 16)
    # a bare string is one corruption, in the stream and its first stage
    one = CorruptionStream(dict(type='CIFARC', data_root=root),
                           corruptions=names[1])
    assert one.data.names == [names[1]] and len(one) == 40
    assert CorruptionStream.first_stage_options(
        dict(corruptions=names[1])) == dict(corruptions=[names[1]])
    # batch size 1: one image per step
    assert len(StageBatchSampler(DefaultSampler(ds, shuffle=False), 1)) \
        == 120


def test_the_old_label_shift_spelling_names_the_new_one(stream):
    data, _ = stream
    with pytest.raises(KeyError, match="spelt 'label-shift'"):
        build_stream(dict(type='label_shift'), data, 0)
