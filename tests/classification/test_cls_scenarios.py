"""Test-stream scenarios: label shift, mild (per corruption), mixed,
continual and batch size 1, all seeded."""
import numpy as np

from mmseg_stag.classification import build_stream


def test_label_shift_stream_is_sorted_by_class(stream, names):
    data, _ = stream
    stages = build_stream(dict(type='label_shift', batch_size=7), data, 3)
    assert [s.name for s in stages] == list(names)
    assert all(s.reset for s in stages)
    for s in stages:
        idx = np.concatenate(s.batches)
        np.testing.assert_array_equal(np.sort(idx), data.indices_of(s.name))
        labels = data.labels[idx]
        # each class forms one contiguous run (imbalance ratio inf)
        runs = labels[np.r_[True, labels[1:] != labels[:-1]]]
        assert len(runs) == len(set(labels.tolist()))
    again = build_stream(dict(type='label_shift', batch_size=7), data, 3)
    assert all(np.array_equal(a, b) for a, b in
               zip(stages[0].batches, again[0].batches))
    plain = build_stream(dict(type='label_shift', batch_size=7,
                              shuffle_class_order=False), data, 3)
    lab = data.labels[np.concatenate(plain[0].batches)]
    assert np.all(np.diff(lab) >= 0)


def test_mild_and_mixed_streams_are_seeded_shuffles(stream, names):
    data, _ = stream
    a = build_stream(dict(type='mild', batch_size=16), data, seed=1)
    b = build_stream(dict(type='mild', batch_size=16), data, seed=1)
    c = build_stream(dict(type='mild', batch_size=16), data, seed=2)
    flat = [np.concatenate(s.batches) for s in a]
    assert [len(x) for x in a[0].batches] == [16, 16, 8]
    assert all(np.array_equal(x, np.concatenate(y.batches))
               for x, y in zip(flat, b))
    assert not np.array_equal(flat[0], np.concatenate(c[0].batches))
    assert not np.array_equal(flat[0], data.indices_of(names[0]))
    mixed = build_stream(dict(type='mixed', batch_size=64), data, seed=1)
    assert len(mixed) == 1 and mixed[0].name == 'mixed'
    idx = np.concatenate(mixed[0].batches)
    np.testing.assert_array_equal(np.sort(idx), np.arange(len(data)))
    # corruptions are interleaved, not in blocks
    assert len(set(data.domain[idx[:20]].tolist())) > 1
    again = build_stream(dict(type='mixed', batch_size=64), data, seed=1)
    np.testing.assert_array_equal(idx, np.concatenate(again[0].batches))


def test_continual_and_bs1_streams(stream, names):
    data, _ = stream
    cont = build_stream(dict(type='continual', batch_size=16), data, 0)
    assert [s.name for s in cont] == list(names)
    assert [s.reset for s in cont] == [True, False, False]
    np.testing.assert_array_equal(np.concatenate(cont[1].batches),
                                  data.indices_of(names[1]))
    bs1 = build_stream(dict(type='batch_size_1'), data, 0)
    assert all(len(b) == 1 for s in bs1 for b in s.batches)
    assert all(s.reset for s in bs1)
