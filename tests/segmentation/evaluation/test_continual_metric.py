"""``ContinualIoUMetric``: per-image records in ``results`` (MMEngine's
``BaseMetric`` contract), per-stage accumulation against an independent
numpy confusion matrix, the mean over stages, results gathered from several
ranks, files, partial results, table, errors."""
import csv
import itertools
import json

import numpy as np
import pytest
import torch
from mmengine.evaluator import Evaluator
from mmengine.registry import init_default_scope
from mmengine.structures import PixelData
from mmseg.datasets import CityscapesDataset
from mmseg.registry import METRICS
from mmseg.structures import SegDataSample

import mmseg_stag.engine.stream_metric as cm
from mmseg_stag.engine.stream import StreamStage
from mmseg_stag.segmentation.evaluation import ContinualIoUMetric

CLASSES = CityscapesDataset.METAINFO['classes']
STAGES = [(1, 'fog'), (1, 'night'), (2, 'fog'), (2, 'night')]


def make_sample(pred, label, stage, round_, condition, as_dict=True):
    """What ``EncoderDecoder.predict`` returns (plus the stream tags), as
    the evaluator hands it to a metric (a dict) or as a data element."""
    s = SegDataSample(metainfo=dict(stage=stage, round=round_,
                                    condition=condition,
                                    img_path=f'{condition}_{stage}.png'))
    s.pred_sem_seg = PixelData(data=torch.as_tensor(pred)[None])
    s.gt_sem_seg = PixelData(data=torch.as_tensor(label)[None])
    return s.to_dict() if as_dict else s


def open_stage(metric, sample):
    """Open the sample's stage unless it is open: the loop's stage event."""
    tags = sample if isinstance(sample, dict) else sample.metainfo
    stage = StreamStage(tags['stage'], tags['round'], tags['condition'], 0, 1)
    if getattr(metric, 'fed_stage', None) != stage:
        metric.start_stage(stage)
        metric.fed_stage = stage


def feed(metric, samples):
    """Feed samples as the online loop does: one batch per run of samples
    of one stage, each stage opened before its first batch."""
    for _, group in itertools.groupby(samples, key=lambda s: s['stage']):
        group = list(group)
        open_stage(metric, group[0])
        metric.process({}, group)


def confusion(pairs, num_classes=19, ignore=255):
    """Independent reference: confusion matrix summed over the pairs."""
    conf = np.zeros((num_classes, num_classes), dtype=np.int64)
    for pred, label in pairs:
        valid = label != ignore
        np.add.at(conf, (label[valid], pred[valid]), 1)
    return conf


def iou_from_confusion(conf):
    inter = np.diag(conf).astype(float)
    union = conf.sum(0) + conf.sum(1) - inter
    with np.errstate(invalid='ignore', divide='ignore'):
        return np.where(union > 0, inter / union, np.nan)


def make_stream(seed=0):
    """2 rounds x 2 conditions, 3 images a stage, with ignore pixels, a
    class only in predictions (stage 0) and a class absent (stage 1)."""
    rng = np.random.default_rng(seed)
    stream, pairs_per_stage = [], {}
    for stage, (round_, cond) in enumerate(STAGES):
        pairs = []
        for i in range(3):
            h, w = (6, 7) if i < 2 else (5, 9)  # sizes may differ
            label = rng.integers(0, 6, size=(h, w))
            pred = np.where(rng.random((h, w)) < .6, label,
                            rng.integers(0, 6, size=(h, w)))
            label[rng.random((h, w)) < .2] = 255
            label[0, 0] = 255
            pred[0, 0] = 9  # ignored: class 9 must stay absent
            if stage == 0:
                pred[1, 1] = 7  # class 7: predicted only -> IoU 0
                label[1, 1] = 0
            if stage == 1:  # class 3 absent from gt and prediction
                label[label == 3] = 4
                pred[pred == 3] = 2
            pairs.append((pred, label))
            stream.append(make_sample(pred, label, stage, round_, cond))
        pairs_per_stage[stage] = pairs
    return stream, pairs_per_stage


def test_hand_computed_stage_accumulates_areas():
    """Two images of one stage: IoU from summed areas, not per image."""
    metric = ContinualIoUMetric()
    a = make_sample(np.array([[0, 0], [1, 1]]), np.array([[0, 1], [1, 255]]),
                    0, 1, 'fog')
    b = make_sample(np.array([[2, 2]]), np.array([[2, 2]]), 0, 1, 'fog')
    feed(metric, [a, b])
    res = metric.compute_metrics(metric.results)
    # class 0: 1/2, class 1: 1/2, class 2: 2/2 -> 66.67 (per image: 75)
    assert res['mIoU_mean_over_stages'] == pytest.approx(200 / 3)
    assert res['r1_fog'] == pytest.approx(66.67)


def test_per_stage_miou_matches_numpy(tmp_path):
    stream, pairs = make_stream()
    metric = ContinualIoUMetric(output_dir=str(tmp_path))
    metric.dataset_meta = CityscapesDataset.METAINFO
    for i in range(0, len(stream), 3):
        feed(metric, stream[i:i + 3])
    # three stages finished before the end
    assert (tmp_path / 'continual_results.partial.jsonl').read_text().count(
        '\n') == 3
    results = metric.compute_metrics(metric.results)
    data = json.loads((tmp_path / 'continual_results.json').read_text())

    expected, per_image = {}, {}
    for stage, ps in pairs.items():
        iou = iou_from_confusion(confusion(ps)) * 100
        expected[stage] = float(np.nanmean(iou))
        per_image[stage] = float(np.mean([
            np.nanmean(iou_from_confusion(confusion([p]))) * 100 for p in ps
        ]))
        got = data['stages'][stage]['details']['per_class_IoU']
        for name, v in zip(CLASSES, iou):
            if np.isnan(v):
                assert got[name] is None, (stage, name)
            else:
                assert got[name] == pytest.approx(v), (stage, name)
    # the checks below can only pass with whole-stage accumulation
    assert any(abs(expected[s] - per_image[s]) > 0.5 for s in expected)

    assert [s['stage'] for s in data['stages']] == [0, 1, 2, 3]
    assert [(s['round'], s['condition']) for s in data['stages']] == STAGES
    assert [s['num_images'] for s in data['stages']] == [3] * 4
    got = {s['stage']: s['score'] for s in data['stages']}
    assert got == pytest.approx(expected)
    mean = np.mean(list(expected.values()))
    assert results['mIoU_mean_over_stages'] == pytest.approx(mean)
    assert data['mean_over_stages'] == pytest.approx(mean)
    assert data['conditions'] == ['fog', 'night'] and data['rounds'] == 2
    for stage, (round_, cond) in enumerate(STAGES):
        assert results[f'r{round_}_{cond}'] == pytest.approx(
            expected[stage], abs=0.005)
    assert set(results) == {'mIoU_mean_over_stages', 'r1_fog', 'r1_night',
                            'r2_fog', 'r2_night'}
    assert all(isinstance(v, float) for v in results.values())
    # absent classes are excluded; a predicted-only class counts as 0
    s0, s1 = data['stages'][0], data['stages'][1]
    assert s0['details']['per_class_IoU'][CLASSES[7]] == 0.0  # traffic sign
    # only at ignored pixels
    assert s0['details']['per_class_IoU'][CLASSES[9]] is None
    assert s1['details']['per_class_IoU'][CLASSES[3]] is None  # wall
    assert s0['details']['per_class_IoU'][CLASSES[3]] is not None
    # never in the stream
    assert s0['details']['per_class_IoU']['bicycle'] is None
    assert (tmp_path / 'continual_miou.png').stat().st_size > 1000


def test_process_appends_one_record_per_image():
    """MMEngine's BaseMetric contract: ``process`` only appends to
    ``results`` (what MMEngine gathers across ranks); ``compute_metrics``
    reads nothing else."""
    stream, pairs = make_stream(seed=5)
    metric = ContinualIoUMetric()
    feed(metric, stream[:5])  # a batch of stage 0, one of stage 1
    feed(metric, stream[5:])
    assert len(metric.results) == len(stream) == 12
    # the open stage's areas stay tensors (on the prediction's device: no
    # read per image); its end reads them, once
    last = [r['areas'] for r in metric.results if r['stage'] == 3]
    assert len(last) == 3 and all(torch.is_tensor(a) for a in last)
    metric.end_stage()
    images = [p for stage in sorted(pairs) for p in pairs[stage]]
    assert [r['batch'] for r in metric.results] == \
        [0] * 3 + [1] * 2 + [2] + [3] * 3 + [4] * 3
    for record, (stage, round_, cond), (pred, label) in zip(
            metric.results, [(s, r, c) for s, (r, c) in enumerate(STAGES)
                             for _ in range(3)], images):
        assert set(record) == {'stage', 'round', 'condition', 'areas',
                               'batch'}
        assert (record['stage'], record['round'],
                record['condition']) == (stage, round_, cond)
        areas = record['areas']
        assert isinstance(areas, np.ndarray) and areas.dtype == np.float64
        assert areas.shape == (4, 19)
        conf = confusion([(pred, label)])
        inter = np.diag(conf)
        np.testing.assert_array_equal(areas[0], inter)  # intersection
        np.testing.assert_array_equal(  # union
            areas[1], conf.sum(0) + conf.sum(1) - inter)
        np.testing.assert_array_equal(areas[2], conf.sum(0))  # prediction
        np.testing.assert_array_equal(areas[3], conf.sum(1))  # label
    # compute_metrics uses the results it is given, not the metric's own
    res = ContinualIoUMetric().compute_metrics(metric.results[:6])
    assert set(res) == {'mIoU_mean_over_stages', 'r1_fog', 'r1_night'}


@pytest.mark.parametrize('order', ['concatenated', 'interleaved'])
def test_results_gathered_from_two_ranks_give_the_same_stages(order,
                                                              tmp_path):
    """Two ranks, each with every other image (DefaultSampler's split):
    their ``results`` gathered (rank by rank, or interleaved as MMEngine's
    ``collect_results`` orders them) give the stage numbers of one rank
    that saw the whole stream."""
    stream, _ = make_stream(seed=4)
    single = ContinualIoUMetric(output_dir=str(tmp_path / 'one'))
    feed(single, stream)
    expected = single.compute_metrics(single.results)
    ranks = [ContinualIoUMetric(), ContinualIoUMetric()]
    for i, sample in enumerate(stream):
        feed(ranks[i % 2], [sample])
    if order == 'concatenated':
        gathered = ranks[0].results + ranks[1].results
    else:
        gathered = [r for pair in zip(*(m.results for m in ranks))
                    for r in pair]
    assert len(gathered) == len(stream)
    merged = ContinualIoUMetric(output_dir=str(tmp_path / 'two'))
    assert merged.compute_metrics(gathered) == expected
    one = json.loads((tmp_path / 'one' / 'continual_results.json').read_text())
    two = json.loads((tmp_path / 'two' / 'continual_results.json').read_text())
    assert two == one
    assert [s['num_images'] for s in two['stages']] == [3] * 4


def test_files_one_entry_per_stage(tmp_path):
    stream, pairs = make_stream(seed=1)
    metric = ContinualIoUMetric(output_dir=str(tmp_path / 'out'))
    feed(metric, stream)
    metric.compute_metrics(metric.results)
    out = tmp_path / 'out'
    data = json.loads((out / 'continual_results.json').read_text())
    assert len(data['stages']) == 4
    for s in data['stages']:
        assert set(s) == {'stage', 'round', 'condition', 'score_name',
                          'score', 'details', 'num_images'}
        assert s['score_name'] == 'mIoU'
        assert list(s['details']['per_class_IoU']) == list(CLASSES)
    with open(out / 'continual_results.csv') as f:
        rows = list(csv.reader(f))
    assert rows[0][:4] == ['stage', 'round', 'condition', 'mIoU']
    assert rows[0][4:23] == list(CLASSES)
    assert len(rows) == 5
    assert [r[2] for r in rows[1:]] == ['fog', 'night', 'fog', 'night']
    for r, s in zip(rows[1:], data['stages']):
        assert float(r[3]) == pytest.approx(s['score'], abs=0.005)
    png = (out / 'continual_miou.png').read_bytes()
    assert png[:8] == b'\x89PNG\r\n\x1a\n' and len(png) > 1000
    partial = (out / 'continual_results.partial.jsonl').read_text()
    assert [json.loads(line)['stage'] for line in partial.splitlines()] == [
        0, 1, 2, 3
    ]


def test_partial_results_written_as_stages_finish(tmp_path):
    stream, pairs = make_stream(seed=2)
    partial = tmp_path / 'continual_results.partial.jsonl'
    partial.write_text('{"stale": "from an older run"}\n')
    metric = ContinualIoUMetric(output_dir=str(tmp_path))
    feed(metric, stream[:3])  # stage 0 only: nothing finished yet
    assert 'stale' in partial.read_text()
    feed(metric, stream[3:4])  # stage 1 starts -> stage 0 finished
    lines = partial.read_text().splitlines()
    assert len(lines) == 1  # the stale file was restarted
    first = json.loads(lines[0])
    assert (first['stage'], first['round'], first['condition']) == (0, 1,
                                                                    'fog')
    expected0 = np.nanmean(iou_from_confusion(confusion(pairs[0]))) * 100
    assert first['score'] == pytest.approx(expected0)
    assert first['num_images'] == 3
    feed(metric, stream[4:7])  # stage 2 starts
    assert len(partial.read_text().splitlines()) == 2
    # a crash here leaves stages 0 and 1 on disk; no final files yet
    assert not (tmp_path / 'continual_results.json').exists()


def test_table_layout_and_log(monkeypatch):
    logged = []
    monkeypatch.setattr(cm, 'print_log',
                        lambda msg, *a, **k: logged.append(str(msg)))
    stream, pairs = make_stream(seed=3)
    metric = ContinualIoUMetric()
    feed(metric, stream)
    res = metric.compute_metrics(metric.results)
    table = [m for m in logged if 'Round |' in m]
    assert len(table) == 1
    lines = table[0].splitlines()
    header = next(line for line in lines if line.startswith('Round |'))
    assert header.split('|')[1:] == ['    fog ', '  night ', '   Mean']
    rows = {line.split('|')[0].strip(): line.split('|')[1:]
            for line in lines if '|' in line}
    stage = [float(np.nanmean(iou_from_confusion(confusion(pairs[s]))) * 100)
             for s in range(4)]
    assert [float(v) for v in rows['1']] == pytest.approx(
        [round(stage[0], 1), round(stage[1], 1),
         round((stage[0] + stage[1]) / 2, 1)], abs=0.051)
    assert [float(v) for v in rows['Mean']] == pytest.approx(
        [round((stage[0] + stage[2]) / 2, 1),
         round((stage[1] + stage[3]) / 2, 1),
         round(res['mIoU_mean_over_stages'], 1)],
        abs=0.051)
    # one progress line per finished stage
    assert sum(m.startswith('stage ') for m in logged) == 4


def test_through_mmengine_evaluator(tmp_path):
    """The evaluator converts data elements, sets dataset_meta and adds the
    prefix; custom class names come from dataset_meta."""
    init_default_scope('mmseg')
    metric = METRICS.build(dict(type='ContinualIoUMetric'))
    evaluator = Evaluator(metric)
    evaluator.dataset_meta = dict(classes=('a', 'b', 'c'),
                                  palette=[[0, 0, 0]] * 3)
    # what OnlineAdaptationLoop does when it is None: the work dir
    metric.output_dir = str(tmp_path)
    samples = [
        make_sample(np.array([[0, 1], [2, 2]]), np.array([[0, 1], [2, 1]]),
                    0, 1, 'fog', as_dict=False),
        make_sample(np.array([[0, 0]]), np.array([[0, 255]]), 1, 1, 'snow',
                    as_dict=False),
    ]
    for s in samples:
        open_stage(metric, s)
        evaluator.process([s])
    res = evaluator.evaluate(2)
    # stage 0: a 1/1, b 1/2, c 1/2 -> 66.67; stage 1: a 1/1 -> 100
    assert res['continual/r1_fog'] == pytest.approx(66.67)
    assert res['continual/r1_snow'] == pytest.approx(100.0)
    assert res['continual/mIoU_mean_over_stages'] == pytest.approx(
        (200 / 3 + 100) / 2)
    data = json.loads((tmp_path / 'continual_results.json').read_text())
    assert data['stages'][1]['details']['per_class_IoU'] == {
        'a': 100.0, 'b': None, 'c': None}
    # state is reset: a second evaluation starts from scratch
    metric.start_stage(StreamStage(0, 1, 'snow', 0, 1))
    evaluator.process([samples[1]])
    assert evaluator.evaluate(1)[
        'continual/mIoU_mean_over_stages'] == pytest.approx(100.0)


def test_no_open_stage_and_bad_sizes():
    metric = ContinualIoUMetric()
    sample = make_sample(np.zeros((2, 2), int), np.zeros((2, 2), int), 0, 1,
                         'fog')
    with pytest.raises(RuntimeError, match='OnlineAdaptationLoop'):
        metric.process({}, [sample])  # outside the loop: no stage open
    bad = make_sample(np.zeros((2, 2), int), np.zeros((2, 3), int), 0, 1,
                      'fog')
    with pytest.raises(ValueError, match='original image size'):
        feed(metric, [bad])
    with pytest.raises(ValueError, match='no sample'):
        ContinualIoUMetric().compute_metrics([])


def test_second_metric_writes_its_files_behind_its_prefix(tmp_path):
    """The names the loop gives two metrics (``assign_result_files``):
    the first keeps the plain names, the second writes its own behind its
    prefix; both sets are there, each of its own metric."""
    stream, _ = make_stream(seed=5)
    first = ContinualIoUMetric(output_dir=str(tmp_path))
    second = ContinualIoUMetric(output_dir=str(tmp_path), ignore_index=1,
                                prefix='ign1')
    cm.assign_result_files([first, second])
    assert (first.file_prefix, second.file_prefix) == ('', 'ign1')
    for metric in (first, second):
        feed(metric, stream)
        metric.compute_metrics(metric.results)
    plain, prefixed = [json.loads((tmp_path / f'{p}continual_results.json')
                                  .read_text()) for p in ('', 'ign1_')]
    # class 1 ignored: another score per stage, so neither file is the other
    assert [s['score'] for s in plain['stages']] != \
        [s['score'] for s in prefixed['stages']]
    for name in ('continual_results.csv', 'continual_miou.png',
                 'continual_results.partial.jsonl'):
        assert (tmp_path / name).is_file() and \
            (tmp_path / f'ign1_{name}').is_file(), name
    partial = (tmp_path / 'ign1_continual_results.partial.jsonl').read_text()
    assert [json.loads(line)['score'] for line in partial.splitlines()] == \
        [s['score'] for s in prefixed['stages']]


def test_metrics_that_would_share_files_are_refused():
    same = [ContinualIoUMetric(), ContinualIoUMetric(ignore_index=1)]
    with pytest.raises(ValueError, match=(
            r"test_evaluator\[0\] \(ContinualIoUMetric, prefix 'continual'\)"
            r" and test_evaluator\[1\] \(ContinualIoUMetric, prefix "
            r"'continual'\) would write the same.*give test_evaluator\[1\] a "
            r"prefix of its own \(e\.g\. prefix='second'\)")):
        cm.assign_result_files(same)
    with pytest.raises(ValueError, match=r"test_evaluator\[1\].*prefix "
                       r"'a/b'.*letters, digits"):
        cm.assign_result_files([ContinualIoUMetric(),
                                ContinualIoUMetric(prefix='a/b')])
    nameless = ContinualIoUMetric(prefix='x')
    nameless.prefix = None  # a metric of a class without default_prefix
    with pytest.raises(ValueError, match=r"test_evaluator\[2\].*would write "
                       r"the result files of test_evaluator\[0\]"):
        cm.assign_result_files([ContinualIoUMetric(), object(), nameless])


def test_keep_results_is_what_mmseg_out_sets_and_nothing_else():
    """``tools/test.py --out`` (ours, MMSeg's) sets ``output_dir`` and
    ``keep_results=True``: taken (the results are always kept); ``False``
    would ask for a deletion nothing does, so it is refused naming it; an
    unknown argument too."""
    init_default_scope('mmseg')
    metric = METRICS.build(dict(type='ContinualIoUMetric', output_dir='o',
                                keep_results=True))
    assert metric.output_dir == 'o'
    with pytest.raises(ValueError, match='keep_results=False is not '
                       'supported: the results are always kept'):
        ContinualIoUMetric(keep_results=False)
    with pytest.raises(TypeError, match=r"unknown arguments \['format_only'"):
        ContinualIoUMetric(format_only=True)
    # the classification stream's metric, the same way
    from mmseg_stag.classification.metric import StreamAccuracyMetric
    assert StreamAccuracyMetric(keep_results=True).output_dir is None
    with pytest.raises(ValueError, match='StreamAccuracyMetric: '
                       'keep_results=False is not supported'):
        StreamAccuracyMetric(keep_results=False)
