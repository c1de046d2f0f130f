import itertools
from typing import Dict, List, Sequence, Tuple

import torch
import torch.nn as nn

from mmseg_stag.core import Labels
from mmseg_stag.core.methods.cotta import CoTTABase
from ..task_adapter import SegmentationBatch

#: classification CoTTA's options that have no meaning here: its teacher
#: augmentations and its per-sample losses
CLASSIFICATION_ONLY = ('num_augs', 'augment', 'always_augment', 'loss')


class SegmentationCoTTA(CoTTABase):
    """CoTTA per pixel: a multi-view teacher label at full size.

    Follows CoTTA's ACDC mmseg/apis/test.py (single_gpu_cotta). The
    segmentation task builds it for ``type='cotta'`` (its ``OWN_METHODS``,
    not a registry). The teacher averages
    the pipeline's views (``ScaleFlipViews``) and the student's loss is the
    cross-entropy to the teacher's label map, so the classification CoTTA's
    augmentation options and ``loss`` are refused, not ignored.

    Args:
        batch_views (bool): Run consecutive teacher views of one input size
            (a scale and its flip) as one batch, not one at a time as the
            authors do. Batched kernels round differently, so labels can
            differ where two classes tie. Default: False.
        **kwargs: :class:`~mmseg_stag.core.methods.cotta.CoTTABase`'s
            arguments (``ema_momentum``, ``restore_prob``, ``ap``,
            ``restore_on_device``) and ``BaseMethod``'s.

    Raises:
        TypeError: If given an option of the classification CoTTA only
            (``num_augs``, ``augment``, ``always_augment``, ``loss``).
    """

    supported_prediction_kinds = ('per_pixel', )
    needs_original_size = True
    repr_fields = ('batch_views', )

    def __init__(self, batch_views: bool = False, **kwargs):
        unused = [k for k in CLASSIFICATION_ONLY if k in kwargs]
        if unused:
            # a TypeError as for any unknown argument, with the reason
            raise TypeError(
                f'segmentation CoTTA has no option {", ".join(unused)}: '
                "classification CoTTA's teacher augmentations and loss. "
                "Here the teacher averages the pipeline's views "
                '(ScaleFlipViews, configs/_base_/datasets/'
                'acdc_continual_views.py) and the student learns its '
                'label map by cross-entropy; remove the option(s) from '
                'the method config')
        super().__init__(**kwargs)
        self.batch_views = bool(batch_views)

    @property
    def graph_capturable(self) -> bool:
        """Unlike the classification CoTTA, no host-side branch on the
        source model's confidence (the label map mixes both predictions
        per pixel); but the authors' restore mask is drawn on the CPU and
        copied, which a graph would replay as captured: capturable with
        ``restore_on_device=True`` (or nothing to restore)."""
        return self.restore_on_device or self.restore_prob == 0

    @torch.no_grad()
    def teacher_prediction(self, batch, stats):
        """Return the multi-view teacher's labels at the original size."""
        if not batch.views:
            raise ValueError(
                'CoTTA on segmentation averages its teacher over the views of '
                'a multi-view pipeline (ScaleFlipViews, see configs/_base_/'
                'datasets/acdc_continual_views.py); this batch has one view')
        labels, view_stats = teacher_labels(
            self.task_adapter, self.teacher, self.source_model, batch.views,
            batch.main_view, self.ap, self.batch_views)
        stats.extra.update(view_stats)
        return Labels(labels)

    def loss_to_teacher(self, student, teacher):
        return self.task_adapter.cross_entropy_at_original_size(student,
                                                           teacher.value)


@torch.no_grad()
def view_probabilities(task_adapter, model: nn.Module, view) -> torch.Tensor:
    """Return a view's softmax at the original size, flip undone."""
    return task_adapter.logits_at_original_size(
        view, task_adapter.forward(model, view)).softmax(dim=1)


def view_groups(views: Sequence, batch_views: bool) -> List[List[int]]:
    """Indices of the views run together: runs of consecutive views with
    one input shape if ``batch_views``, else one view each."""
    if not batch_views:
        return [[idx] for idx in range(len(views))]
    return [list(group) for _, group in itertools.groupby(
        range(len(views)), key=lambda idx: views[idx].inputs.shape)]


def merge_views(views: Sequence) -> SegmentationBatch:
    """Views of one input shape as one batch (images in view order)."""
    if len(views) == 1:
        return views[0]
    return SegmentationBatch(
        inputs=torch.cat([v.inputs for v in views]),
        data_samples=[s for v in views for s in v.data_samples],
        metas=[m for v in views for m in v.metas])


@torch.no_grad()
def teacher_labels(task_adapter, teacher: nn.Module, source_model: nn.Module,
                   views: Sequence, main_view: int, threshold: float,
                   batch_views: bool = False
                   ) -> Tuple[torch.Tensor, Dict[str, float]]:
    """Return the label map CoTTA trains on and evaluates, and stats:
    the teacher's on the main view (the unflipped one at scale 1) where the
    source model's confidence there exceeds ``threshold`` (CoTTA's ``ap``),
    else the argmax of its probabilities averaged over the views.
    """
    total = None
    for group in view_groups(views, batch_views):
        # each view's probabilities added in view order, as one at a time
        for idx, probs in zip(group, view_probabilities(
                task_adapter, teacher, merge_views([views[i] for i in group]))
                .chunk(len(group))):
            if idx == main_view:
                single = probs.argmax(dim=1)
            total = probs if total is None else total + probs
    multi = (total / len(views)).argmax(dim=1)
    # CoTTA's anchor model predicts every view but uses only the main one
    confidence = view_probabilities(task_adapter, source_model,
                                    views[main_view]).max(dim=1)[0]
    confident = confidence > threshold
    labels = torch.where(confident, single, multi)
    return labels, dict(confident_pixels=confident.float().mean(),
                        num_views=float(len(views)))
