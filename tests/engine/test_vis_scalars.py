"""What the online loop sends to MMEngine's visualizer backends (a
TensorBoard or W&B backend in ``vis_backends`` gets the same calls):
every step's statistics by batch, and each stage's score, along the stream
and per condition along the rounds; here through ``LocalVisBackend``'s
``scalars.json``."""
import glob
import json
import os.path as osp

from seg_helpers import make_runner


def scalars(work_dir):
    paths = glob.glob(osp.join(str(work_dir), '*', 'vis_data',
                               'scalars.json'))
    assert len(paths) == 1, paths
    with open(paths[0]) as f:
        return [json.loads(line) for line in f]


def test_step_statistics_and_stage_scores_reach_the_backends(
        tiny_acdc, confident_checkpoint, tmp_path):
    runner = make_runner('tent-stag', tiny_acdc, confident_checkpoint,
                         tmp_path, rounds=2, extra={
                             'default_hooks.logger.interval': 3,
                             'vis_backends': [dict(type='LocalVisBackend')],
                             'visualizer.vis_backends':
                             [dict(type='LocalVisBackend')],
                             # MMEngine keeps one visualizer per name and
                             # process: a fresh one writes into this run
                             'visualizer.name': f'vis_{tmp_path.name}'})
    runner.test()
    lines = scalars(tmp_path)
    steps = [line for line in lines if 'test/loss' in line]
    # 16 batches: each step once, by batch, with its STAG term and beta
    assert [line['step'] for line in steps] == list(range(1, 17))
    assert all({'test/loss_stag', 'test/beta', 'test/loss_base'} <= set(line)
               for line in steps)
    with open(osp.join(tmp_path, 'continual_results.json')) as f:
        stages = json.load(f)['stages']
    along = [(line['step'], line['continual/mIoU']) for line in lines
             if 'continual/mIoU' in line]
    assert along == [(k + 1, s['score']) for k, s in enumerate(stages)]
    fog = [(line['step'], line['continual/fog/mIoU']) for line in lines
           if 'continual/fog/mIoU' in line]
    assert fog == [(s['round'], s['score']) for s in stages
                   if s['condition'] == 'fog']
    assert [r for r, _ in fog] == [1, 2]
