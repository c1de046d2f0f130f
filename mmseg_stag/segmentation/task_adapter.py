"""A segmentation batch and the operations a method may ask of it."""
from dataclasses import dataclass, field
from typing import Any, Callable, List, Optional

import torch
from mmengine.structures import PixelData

from mmseg_stag.core import Batch, ForwardPass, TaskAdapter


@dataclass
class SegmentationBatch(Batch):
    """A preprocessed segmentation batch.

    Args:
        metas (list[dict]): Each image's metainfo, for ``model.inference``.
        views (list[SegmentationBatch], optional): Every view (scale, flip)
            of a multi-view pipeline; None: one view.
        main_view (int): The index of this batch in ``views``. Default: 0.
    """
    metas: List[dict] = field(default_factory=list)
    views: Optional[List['SegmentationBatch']] = None
    main_view: int = 0


class SegmentationAdapter(TaskAdapter):
    """Operations of an MMSeg segmentor on a :class:`SegmentationBatch`.

    Args:
        probe (HeadProbe): The per-pixel probe of the decode head.
        segmentor (BaseSegmentor): Gives ``postprocess_result``.
    """

    def __init__(self, probe, segmentor):
        super().__init__(probe)
        self.segmentor = segmentor

    def forward(self, model, batch: SegmentationBatch, inputs: Any = None,
                run: Optional[Callable] = None) -> ForwardPass:
        """Run ``model.inference`` once with the batch's metainfo, or
        ``run(model, inputs) -> seg_logits`` in its place (Hybrid-TTA's
        masked student)."""
        metas = batch.metas
        if run is None:
            run = lambda m, x: m.inference(x, metas)  # noqa: E731
        logits, head_outputs = self.probe(
            model, batch.inputs if inputs is None else inputs, run=run)
        return ForwardPass(logits, head_outputs)

    #: the metainfo a forward pass and its post-processing depend on
    GRAPH_META_KEYS = ('img_shape', 'ori_shape', 'pad_shape', 'padding_size',
                       'flip', 'flip_direction')

    def graph_key(self, batch: SegmentationBatch):
        """The inputs' shape, dtype and device, and each image's sizes and
        flip: ``model.inference`` resizes by them."""
        metas = tuple(tuple(repr(meta.get(k)) for k in self.GRAPH_META_KEYS)
                      for meta in batch.metas)
        return super().graph_key(batch) + (metas, )

    @torch.no_grad()
    def postprocess(self, batch: SegmentationBatch,
                    seg_logits: torch.Tensor) -> list:
        """Return the batch's data samples with ``postprocess_result`` of
        ``seg_logits`` set (each image's size, flip undone)."""
        return self.segmentor.postprocess_result(seg_logits.detach(),
                                                 batch.data_samples)

    def postprocessed(self, batch: SegmentationBatch,
                      fwd: ForwardPass) -> list:
        """:meth:`postprocess` of ``fwd``'s logits, made once per forward
        pass and kept on it (a loss and the outputs share it)."""
        if fwd.postprocessed is None:
            fwd.postprocessed = self.postprocess(batch, fwd.logits)
        return fwd.postprocessed

    def labels_at_original_size(self, batch: SegmentationBatch,
                                fwd: ForwardPass) -> torch.Tensor:
        """Return ``[N, H0, W0]`` labels of ``fwd`` at the original size.

        Raises:
            ValueError: If the batch's images differ in size.
        """
        labels = [s.pred_sem_seg.data[0]
                  for s in self.postprocessed(batch, fwd)]
        shapes = {tuple(label.shape) for label in labels}
        if len(shapes) > 1:
            raise ValueError('labels at the original size need images of '
                             f'one size per batch, got {sorted(shapes)}')
        return torch.stack(labels)

    def logits_at_original_size(self, batch: SegmentationBatch,
                                fwd: ForwardPass) -> torch.Tensor:
        """Return ``[N, C, H0, W0]`` logits of ``fwd`` at the original
        size, unflipped."""
        return torch.stack([s.seg_logits.data
                            for s in self.postprocessed(batch, fwd)])


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
