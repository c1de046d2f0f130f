"""Segmentation task of ``OnlineAdaptationLoop`` for MMSeg segmentors."""
from typing import Optional

from mmengine.structures import PixelData
from mmseg.models.segmentors import BaseSegmentor

from mmseg_stag.core import Labels, Prediction, build_method
from mmseg_stag.engine.online_task import ONLINE_TASKS, OnlineTask, preprocess
from .methods.cotta import SegmentationCoTTA
from .task_adapter import SegmentationAdapter, SegmentationBatch

#: the methods this task runs with a class of its own, by config name:
#: CoTTA's ACDC code labels with a multi-view teacher at full size (the
#: classification CoTTA, ``METHODS``' ``cotta``, with augmentations per
#: sample); every other name is ``METHODS``'
OWN_METHODS = {'cotta': SegmentationCoTTA}


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

    def inference_config(self, cfg, meta: dict,
                         path: str = '<config>') -> dict:
        from .models.adapted_segmentor import inference_config
        return inference_config(cfg, meta, path)

    def setup(self, dataset) -> None:
        if self.main_view is None:  # the pipeline's ScaleFlipViews', else 0
            transforms = getattr(getattr(dataset, 'pipeline', None),
                                 'transforms', [])
            self.main_view = next((t.main_view for t in transforms
                                   if hasattr(t, 'main_view')), 0)
        self.main_view = int(self.main_view)

    def build_method(self, cfg: dict):
        """Build ``cfg``: the task's own class for a name of
        :data:`OWN_METHODS`, else ``METHODS``' (``KeyError`` listing them
        for an unknown name)."""
        own = OWN_METHODS.get(cfg.get('type'))
        return build_method(cfg if own is None else dict(cfg, type=own))

    def build_adapter(self, model) -> SegmentationAdapter:
        return SegmentationAdapter(self.probe, model)

    def batch(self, model, data_batch: dict) -> SegmentationBatch:
        views = []
        for view_batch in split_views(data_batch):
            data = preprocess(model, view_batch)
            samples = data['data_samples']
            views.append(SegmentationBatch(
                data['inputs'], samples, [s.metainfo for s in samples]))
        if self.main_view >= len(views):
            raise ValueError(f'main_view={self.main_view}, but the pipeline '
                             f'gives {len(views)} view(s) per image')
        main = views[self.main_view]
        if len(views) > 1 and any(m.get('flip') for m in main.metas):
            raise ValueError(f'main_view={self.main_view} is a flipped view; '
                             'choose the unflipped one at scale 1')
        return SegmentationBatch(
            main.inputs, main.data_samples, main.metas,
            views=views if len(views) > 1 else None,
            main_view=self.main_view)

    def outputs(self, batch: SegmentationBatch,
                prediction: Prediction) -> list:
        if isinstance(prediction, Labels):  # already at the original size
            for sample, label in zip(batch.data_samples, prediction.value):
                shape = tuple(sample.metainfo['ori_shape'])
                if tuple(label.shape) != shape:
                    raise ValueError(
                        f'a label prediction of shape {tuple(label.shape)} '
                        f'for an image of original size {shape}')
                sample.set_data(dict(pred_sem_seg=PixelData(data=label[None])))
            return batch.data_samples
        if prediction.postprocessed is not None:  # made by the loss
            return prediction.postprocessed
        return self.task_adapter.postprocess(batch, prediction.value)

    def source_batch(self, inputs) -> SegmentationBatch:
        """Whole-image metainfo, as the clean images come."""
        shape = tuple(inputs.shape[-2:])
        metas = [dict(img_shape=shape, ori_shape=shape, pad_shape=shape,
                      padding_size=[0, 0, 0, 0])] * len(inputs)
        return SegmentationBatch(inputs, metas=metas)


def split_views(data_batch: dict) -> list:
    """Return ``[data_batch]``, or one batch per view of a multi-view one."""
    inputs = data_batch['inputs']
    if not (isinstance(inputs, (list, tuple)) and inputs
            and isinstance(inputs[0], (list, tuple))):
        return [data_batch]
    return [dict(inputs=inputs[i], data_samples=data_batch['data_samples'][i])
            for i in range(len(inputs))]
