"""Helpers of the tests on unlabeled frames (``tests/apis``,
``tests/tools/test_adapt.py``): the benchmark loop's predictions on the
tiny labeled stream, to hold the frames' predictions to."""
import os.path as osp

from mmengine.config import Config
from mmengine.hooks import Hook
from seg_helpers import REPO, SEG_CFG, tiny_options

from mmseg_stag.engine.runs import prepare_config, run_test

#: CoTTA on the tiny stream: 6 views, and restores often enough to matter
#: (tests/engine/test_resume.py's)
COTTA = {'test_dataloader.dataset.pipeline.1.scale': (128, 64),
         'test_dataloader.dataset.pipeline.1.ratios': [0.5, 1.0, 1.5],
         'test_cfg.method.restore_prob': 0.5}


def options(method, tiny_acdc):
    opts = tiny_options(tiny_acdc, rounds=1)
    return dict(opts, **COTTA) if method.startswith('cotta') else opts


class Predictions(Hook):
    """Each image's path and label map, as the loop hands them on."""

    def __init__(self):
        self.seen = []

    def after_test_iter(self, runner, batch_idx, data_batch=None,
                        outputs=None):
        for sample in outputs:
            self.seen.append((sample.metainfo['img_path'],
                              sample.pred_sem_seg.data.cpu().numpy()))


def benchmark_predictions(method, tiny_acdc, checkpoint, work_dir):
    """``tools/test.py``'s run of the method's config on the labeled tiny
    stream (4 conditions × 2 images, one round): what each image got."""
    config = osp.join(REPO, SEG_CFG.format(method))
    cfg = Config.fromfile(config)
    cfg.merge_from_dict(options(method, tiny_acdc))
    record = Predictions()
    run_test(prepare_config(cfg, str(work_dir), config), checkpoint,
             hooks=[record])
    return record.seen


def crash_at_frame(monkeypatch, frame: int):
    """``OnlineInferencer.step`` raising ``KeyboardInterrupt`` at frame
    ``frame`` (0-based; the frames before it stepped): a Ctrl-C mid-run.
    Returns the real step, to put back."""
    from mmseg_stag.apis import OnlineInferencer
    step = OnlineInferencer.step

    def crashing(self, data, name=None):
        if self.frames == frame:
            raise KeyboardInterrupt('stopped')
        return step(self, data, name)

    monkeypatch.setattr(OnlineInferencer, 'step', crashing)
    return step
