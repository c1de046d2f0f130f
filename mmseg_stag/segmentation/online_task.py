"""Segmentation task of ``OnlineAdaptationLoop`` for MMSeg segmentors."""
import functools
from typing import Optional

import torch
from mmengine.structures import PixelData
from mmseg.models.segmentors import BaseSegmentor

from mmseg_stag.core import build_method
from mmseg_stag.engine.online_task import (ONLINE_TASKS, OnlineBatch,
                                           OnlineTask)
from .methods import SEGMENTATION_METHODS, SegmentationBatchContext, View


@ONLINE_TASKS.register_module(name='segmentation')
class SegmentationTask(OnlineTask):
    """An MMSeg segmentor on a continual stream such as ACDC.

    Args:
        model (BaseSegmentor): The segmentor.
        head_layer (str, optional): Module name of the decode head's 1x1
            classifier. Default: None (``'decode_head.conv_seg'``).
        main_view (int, optional): The unflipped view of a multi-view
            pipeline that the model adapts on. Default: None (the
            pipeline's ``main_view``, else 0).

    Raises:
        ValueError: If ``main_view`` is not an index.
    """

    name = 'segmentation'
    prediction_kind = 'per_pixel'
    model_kind = 'an MMSeg segmentor'

    def __init__(self, model, head_layer: Optional[str] = None,
                 main_view: Optional[int] = None):
        super().__init__(model, head_layer)
        if main_view is not None and (int(main_view) != main_view
                                      or main_view < 0):
            raise ValueError(f'main_view must be an index >= 0, got '
                             f'{main_view!r}')
        self.main_view = main_view

    @classmethod
    def matches(cls, model) -> bool:
        return isinstance(model, BaseSegmentor)

    def default_head_layer(self, model) -> str:
        return 'decode_head.conv_seg'

    def setup(self, dataset) -> None:
        if self.main_view is None:
            self.main_view = pipeline_main_view(dataset)
        self.main_view = int(self.main_view)

    def build_method(self, cfg: dict):
        """Build from ``SEGMENTATION_METHODS`` first, then the core's."""
        return build_method(cfg, SEGMENTATION_METHODS)

    def probe_forward(self, metas):
        """Return the probe around ``model.inference`` with ``metas``."""
        return functools.partial(
            self.probe, run=lambda m, x: m.inference(x, metas))

    def view(self, model, view_batch: dict) -> View:
        """Return one preprocessed view of a multi-view batch."""
        with torch.no_grad():
            data = model.data_preprocessor(view_batch, False)
        samples = data['data_samples']
        post = Postprocess(model, samples)

        def to_original_size(seg_logits):
            return torch.stack([s.seg_logits.data for s in post(seg_logits)])

        return View(data['inputs'],
                    self.probe_forward([s.metainfo for s in samples]),
                    to_original_size)

    def batch(self, model, data_batch: dict) -> OnlineBatch:
        views = split_views(data_batch)
        if self.main_view >= len(views):
            raise ValueError(f'main_view={self.main_view}, but the pipeline '
                             f'gives {len(views)} view(s) per image')
        with torch.no_grad():
            data = model.data_preprocessor(views[self.main_view], False)
        inputs, data_samples = data['inputs'], data['data_samples']
        metas = [s.metainfo for s in data_samples]
        if len(views) > 1 and any(m.get('flip') for m in metas):
            raise ValueError(f'main_view={self.main_view} is a flipped view; '
                             'choose the unflipped one at scale 1')
        postprocess = Postprocess(model, data_samples)
        ctx = SegmentationBatchContext(
            inputs, self.probe_forward(metas),
            labels_at_original_size=postprocess.labels,
            views=[self.view(model, v) for v in views]
            if len(views) > 1 else None, main_view=self.main_view)

        def to_outputs(prediction):
            if prediction.is_floating_point():  # logits at the input size
                return postprocess(prediction)
            # CoTTA predicts labels at the original size
            return set_labels(data_samples, prediction)

        return OnlineBatch(ctx, to_outputs)

    def source_batches(self, model, dataloader):
        def inputs():
            for batch in dataloader:
                with torch.no_grad():
                    yield model.data_preprocessor(batch, False)['inputs']

        def forward(m, x):  # whole-image metainfo, as the images come
            shape = tuple(x.shape[-2:])
            metas = [dict(img_shape=shape, ori_shape=shape, pad_shape=shape,
                          padding_size=[0, 0, 0, 0])] * len(x)
            return self.probe(m, x, run=lambda m_, x_: m_.inference(x_,
                                                                    metas))

        return forward, inputs()


class Postprocess:
    """``model.postprocess_result`` of one batch, cached per prediction.

    Args:
        model (BaseSegmentor): The segmentor.
        data_samples (list): The batch's data samples.
    """

    def __init__(self, model, data_samples):
        self.model, self.data_samples = model, data_samples
        self.done = self.outputs = None

    @torch.no_grad()
    def __call__(self, seg_logits: torch.Tensor) -> list:
        # same storage and version: same prediction (``done`` pins memory)
        key = (seg_logits.data_ptr(), tuple(seg_logits.shape),
               seg_logits._version)
        if self.done is None or key != self.done[0]:
            self.outputs = self.model.postprocess_result(
                seg_logits.detach(), self.data_samples)
            self.done = (key, seg_logits)
        return self.outputs

    def labels(self, seg_logits: torch.Tensor) -> torch.Tensor:
        """Return ``[N, H0, W0]`` predicted labels at the original size.

        Raises:
            ValueError: If the batch's images differ in size.
        """
        labels = [s.pred_sem_seg.data[0] for s in self(seg_logits)]
        shapes = {tuple(label.shape) for label in labels}
        if len(shapes) > 1:
            raise ValueError('labels at the original size need images of '
                             f'one size per batch, got {sorted(shapes)}')
        return torch.stack(labels)


def pipeline_main_view(dataset) -> int:
    """Return ``main_view`` of the dataset's ``ScaleFlipViews``, else 0."""
    transforms = getattr(getattr(dataset, 'pipeline', None), 'transforms', [])
    for transform in transforms:
        if hasattr(transform, 'main_view'):
            return transform.main_view
    return 0


def split_views(data_batch: dict) -> list:
    """Return ``[data_batch]``, or one batch per view of a multi-view one."""
    inputs = data_batch['inputs']
    if not (isinstance(inputs, (list, tuple)) and inputs
            and isinstance(inputs[0], (list, tuple))):
        return [data_batch]
    return [dict(inputs=inputs[i], data_samples=data_batch['data_samples'][i])
            for i in range(len(inputs))]


def set_labels(data_samples: list, labels: torch.Tensor) -> list:
    """Set ``pred_sem_seg`` of each sample from ``[N, H0, W0]`` labels.

    Raises:
        ValueError: If a label map is not at its image's original size.
    """
    for sample, label in zip(data_samples, labels):
        shape = tuple(sample.metainfo['ori_shape'])
        if tuple(label.shape) != shape:
            raise ValueError(f'a label prediction of shape {tuple(label.shape)}'
                             f' for an image of original size {shape}')
        sample.set_data(dict(pred_sem_seg=PixelData(data=label[None])))
    return data_samples
