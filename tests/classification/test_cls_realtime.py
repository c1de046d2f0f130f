"""The realistic protocol on a classification stream (the same loop
option as segmentation's): which images adapted, in ``per_image.csv``,
the stages' counts and the record; a batch predicted only leaves the
weights as they were."""
import csv
import os.path as osp

from cls_helpers import CIFAR, options
from mmengine.config import Config

from mmseg_stag.engine.report import read_results
from mmseg_stag.engine.runs import prepare_config, run_test


def test_per_image_records_say_which_images_adapted(tmp_path, stream, names,
                                                    checkpoint):
    _, root = stream
    cfg = Config.fromfile(CIFAR.format('tent-stag'))
    # 40 images a corruption in batches of 8: 5 batches a stage, cost 2.5
    # adapts on the first and the fourth of each
    cfg.merge_from_dict(options(root, names, batch_size=8, **{
        'test_cfg.realtime': dict(cost=2.5)}))
    work = tmp_path / 'run'
    _, model = run_test(prepare_config(cfg, str(work)), checkpoint)
    record = read_results(str(work))
    stages = len(names)
    assert record['realtime'] == dict(
        cost=2.5, how='given', period=3, batches_adapted=2 * stages,
        batches_predicted_only=3 * stages, measured=None)
    assert record['num_updates'] == 2 * stages
    assert [s['images_adapted'] for s in record['stages']] == [16] * stages
    with open(osp.join(str(work), 'per_image.csv')) as f:
        rows = list(csv.DictReader(f))
    assert rows[0].keys() >= {'image', 'batch', 'adapted'}
    by_batch = {}
    for row in rows:
        by_batch.setdefault(int(row['batch']), set()).add(row['adapted'])
    assert [by_batch[b] for b in range(5)] == [
        {'1'}, {'0'}, {'0'}, {'1'}, {'0'}]
    with open(osp.join(str(work), 'continual_results.csv')) as f:
        header = next(csv.reader(f))
    assert header[-1] == 'images_adapted'
