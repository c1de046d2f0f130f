"""``OnlineAdaptationLoop``: MMSeg's test loop that adapts the model online."""
import functools
from typing import Optional, Sequence, Union

import torch
from mmengine.dist import get_world_size
from mmengine.logging import print_log
from mmengine.model import is_model_wrapper
from mmengine.runner import TestLoop, autocast
from mmseg.registry import LOOPS

from mmseg_stag.core import BatchContext, HeadProbe, build_method

#: The message of the distributed guard (a later mode will run whole streams
#: per rank; see the README).
DISTRIBUTED_ERROR = (
    'OnlineAdaptationLoop: a continual stream is sequential (every image is '
    'predicted by the model adapted on all images before it), so it cannot '
    'be split across {n} ranks: each rank would adapt on only 1 of every {n} '
    'images and the metric would see a different stream. Run it with '
    '--launcher none (one process; use several GPUs by running several '
    'configs/seeds side by side).')


@LOOPS.register_module()
class OnlineAdaptationLoop(TestLoop):
    """Test loop that predicts each batch, then adapts the model on it.

    It owns every batch; hooks only observe. One batch::

        run_iter(data_batch)
         ├─ model.data_preprocessor(data_batch) -> inputs, data_samples
         ├─ method.on_stage(stage of the batch)
         ├─ method.adapt(BatchContext(inputs, forward))  [grad if it updates]
         │   ├─ forward(model, inputs): HeadProbe around model.inference
         │   │    -> seg_logits, [(features, logits) at the head's size]
         │   ├─ method.loss(ctx) = L_base + beta_t * L_STAG
         │   └─ backward, optimizer step     (prediction made before it)
         ├─ model.postprocess_result(seg_logits, data_samples)
         ├─ evaluator.process(outputs)       (per-image areas, per stage)
         └─ message_hub: test/loss, test/loss_stag, test/beta, ...

    Args:
        runner (Runner): the runner.
        dataloader (DataLoader | dict): the stream (batch size 1 as in
            CoTTA's protocol, no shuffle).
        evaluator (Evaluator | dict | list): e.g. ``ContinualIoUMetric``.
        method (dict): an online-adaptation method, e.g.
            ``dict(type='tent', stag=dict(beta0=500, gamma=35))``
            (``mmseg_stag.core.METHODS``).
        classifier (str): module name of the decode head's 1x1 classifier.
            Default: ``'decode_head.conv_seg'`` (every MMSeg decode head).
        fp16 (bool): autocast the forward pass. Default: False.
    """

    def __init__(self,
                 runner,
                 dataloader,
                 evaluator: Union[dict, list],
                 method: dict,
                 classifier: str = 'decode_head.conv_seg',
                 fp16: bool = False):
        if get_world_size() > 1:
            raise RuntimeError(DISTRIBUTED_ERROR.format(n=get_world_size()))
        self.method = build_method(method)  # bad options fail here
        self.method.check_output('per_pixel')
        self.probe = HeadProbe(classifier, output='per_pixel')
        self.probe.find(self._model(runner))  # no such 1x1 conv: fail now
        super().__init__(runner, dataloader, evaluator, fp16)

    @staticmethod
    def _model(runner):
        model = runner.model
        return model.module if is_model_wrapper(model) else model

    def run(self) -> dict:
        """Configure the method on the loaded model, then run the stream."""
        self.runner.call_hook('before_test')
        self.runner.call_hook('before_test_epoch')
        model = self._model(self.runner)
        model.eval()
        self.method.configure(model, self.probe.classifier(model),
                              'per_pixel')
        for metric in self.evaluator.metrics:
            if getattr(metric, 'output_dir', False) is None:
                metric.output_dir = self.runner.work_dir
        num = sum(p.numel() for _, p in self.method.params)
        print_log(f'online adaptation: {self.method!r}; '
                  f'{len(self.method.params)} trainable tensors ({num} '
                  'values)', logger='current')
        for idx, data_batch in enumerate(self.dataloader):
            self.run_iter(idx, data_batch)
        print_log(f'online adaptation: {self.method.num_updates} update '
                  'steps', logger='current')
        metrics = self.evaluator.evaluate(len(self.dataloader.dataset))
        self.runner.call_hook('after_test_epoch', metrics=metrics)
        self.runner.call_hook('after_test')
        return metrics

    def run_iter(self, idx: int, data_batch: dict) -> None:
        """Predict, then adapt, on one batch (see the class docstring)."""
        self.runner.call_hook(
            'before_test_iter', batch_idx=idx, data_batch=data_batch)
        model = self._model(self.runner)
        with torch.no_grad():
            data = model.data_preprocessor(data_batch, False)
        inputs, data_samples = data['inputs'], data['data_samples']
        metas = [s.metainfo for s in data_samples]
        self.method.on_stage(batch_stage(metas))
        forward = functools.partial(
            self.probe, run=lambda m, x: m.inference(x, metas))
        with torch.set_grad_enabled(self.method.updates), \
                autocast(enabled=self.fp16):
            seg_logits, stats = self.method.adapt(
                BatchContext(inputs, forward))
        with torch.no_grad():
            outputs = model.postprocess_result(seg_logits, data_samples)
        self.evaluator.process(data_samples=outputs, data_batch=data_batch)
        for key, value in stats.items():
            self.runner.message_hub.update_scalar(f'test/{key}', value)
        self.runner.call_hook(
            'after_test_iter', batch_idx=idx, data_batch=data_batch,
            outputs=outputs)


def batch_stage(metas: Sequence[dict]) -> Optional[int]:
    """The stage tag shared by a batch's images (``None`` untagged)."""
    stages = {meta.get('stage') for meta in metas}
    if len(stages) > 1:
        raise ValueError(f'a batch spans several stages {sorted(stages)}; '
                         'use batch size 1 or stage-aligned batches')
    return stages.pop() if stages else None
