"""Test-stream scenarios: label shift, mild (per corruption), mixed and
continual, all seeded; the stream dataset and its
stage-aligned batches."""
import numpy as np
import pytest
import torch

from mmseg_stag.classification import build_stream


def test_label_shift_stream_is_sorted_by_class(stream, names):
    data, _ = stream
    stages = build_stream(dict(type='label-shift'), data, 3)
    assert [s.name for s in stages] == list(names)
    assert all(s.from_source for s in stages)
    for s in stages:
        idx = s.indices
        np.testing.assert_array_equal(np.sort(idx), data.indices_of(s.name))
        labels = data.labels[idx]
        # each class forms one contiguous run (imbalance ratio inf)
        runs = labels[np.r_[True, labels[1:] != labels[:-1]]]
        assert len(runs) == len(set(labels.tolist()))
    again = build_stream(dict(type='label-shift'), data, 3)
    np.testing.assert_array_equal(stages[0].indices, again[0].indices)
    plain = build_stream(dict(type='label-shift',
                              shuffle_class_order=False), data, 3)
    lab = data.labels[plain[0].indices]
    assert np.all(np.diff(lab) >= 0)


def test_mild_and_mixed_streams_are_seeded_shuffles(stream, names):
    data, _ = stream
    a = build_stream(dict(type='mild'), data, seed=1)
    b = build_stream(dict(type='mild'), data, seed=1)
    c = build_stream(dict(type='mild'), data, seed=2)
    flat = [s.indices for s in a]
    assert all(np.array_equal(x, y.indices) for x, y in zip(flat, b))
    assert not np.array_equal(flat[0], c[0].indices)
    assert not np.array_equal(flat[0], data.indices_of(names[0]))
    mixed = build_stream(dict(type='mixed'), data, seed=1)
    assert len(mixed) == 1 and mixed[0].name == 'mixed'
    idx = mixed[0].indices
    np.testing.assert_array_equal(np.sort(idx), np.arange(len(data)))
    # corruptions are interleaved, not in blocks
    assert len(set(data.domain[idx[:20]].tolist())) > 1
    again = build_stream(dict(type='mixed'), data, seed=1)
    np.testing.assert_array_equal(idx, again[0].indices)


def test_continual_and_mild_streams(stream, names):
    data, _ = stream
    cont = build_stream(dict(type='continual'), data, 0)
    assert [s.name for s in cont] == list(names)
    assert [s.from_source for s in cont] == [True, False, False]
    np.testing.assert_array_equal(cont[1].indices, data.indices_of(names[1]))
    mild = build_stream(dict(type='mild'), data, 0)
    assert all(s.from_source for s in mild)


def test_stream_dataset_stages_and_stage_aligned_batches(stream, names):
    from mmengine.dataset import DefaultSampler

    from mmseg_stag.classification import (CorruptionStream,
                                           StageBatchSampler)
    from mmseg_stag.engine.stream import StreamStage
    _, root = stream
    ds = CorruptionStream(dict(type='CIFARC', data_root=root),
                          corruptions=names, scenario=dict(type='mild'),
                          shuffle_seed=1)
    stages = build_stream(dict(type='mild'), ds.data, 1)
    assert len(ds) == 120
    assert ds.stream_stages() == [
        StreamStage(k, 1, name, 40 * k, 40 * (k + 1), from_source=True)
        for k, name in enumerate(names)]
    item = ds[41]  # the second image of the second stage
    meta = item['data_samples'].metainfo
    assert meta['corruption'] == names[1]
    image, label, _ = ds.data.item(int(stages[1].indices[1]))
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
