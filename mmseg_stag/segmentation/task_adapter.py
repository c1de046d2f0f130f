"""A segmentation batch and the operations a method may ask of it: its
forward pass, and logits, labels and a loss at the original size."""
import functools
from dataclasses import dataclass, field
from typing import Any, Callable, List, Optional, Tuple

import torch
import torch.nn.functional as F

from mmseg_stag.core import Batch, ForwardPass, TaskAdapter
from mmseg_stag.core.probe import run_probe


@dataclass
class SegmentationBatch(Batch):
    """A preprocessed segmentation batch: each image's metainfo (for
    ``model.inference``) and, from a multi-view pipeline, every view (scale,
    flip; None: one view) and this batch's index among them."""
    metas: List[dict] = field(default_factory=list)
    views: Optional[List['SegmentationBatch']] = None
    main_view: int = 0


class SegmentationAdapter(TaskAdapter):
    """Operations of an MMSeg segmentor on a :class:`SegmentationBatch`:
    ``probe`` is its decode head's, ``segmentor`` post-processes."""

    has_original_size = True

    def __init__(self, probe, segmentor):
        super().__init__(probe)
        self.segmentor = segmentor

    def forward(self, model, batch: SegmentationBatch, inputs: Any = None,
                run: Optional[Callable] = None) -> ForwardPass:
        """Run ``model.inference`` once with the batch's metainfo, or
        ``run(inputs) -> seg_logits`` in its place (Hybrid-TTA's masked
        student)."""
        if run is None:
            run = functools.partial(model.inference,
                                    batch_img_metas=batch.metas)
        logits, head_outputs = run_probe(
            self.probe, model, batch.inputs if inputs is None else inputs,
            run, self.autocast_dtype)
        return ForwardPass(logits, head_outputs)

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
            fwd.postprocessed = self.postprocess(batch, fwd.output)
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

    def cross_entropy_at_original_size(
            self, fwd: ForwardPass, labels: Optional[torch.Tensor] = None,
            align_corners: bool = False,
            batch: Optional[SegmentationBatch] = None) -> torch.Tensor:
        """:func:`full_resolution_cross_entropy` of ``fwd``'s head logits
        to ``labels`` (None: ``fwd``'s own labels for ``batch``).

        Raises:
            ValueError: If the forward pass was not a whole-image one.
        """
        if len(fwd.head_outputs) != 1:
            raise ValueError(
                'a loss at the original size trains on the whole image, as '
                "CoTTA's ACDC code does: use whole inference (model.test_cfg."
                f"mode='whole'), got {len(fwd.head_outputs)} classifier "
                'calls per image')
        if labels is None:
            labels = self.labels_at_original_size(batch, fwd)
        return full_resolution_cross_entropy(fwd.head_outputs[0][1], labels,
                                             align_corners)


def full_resolution_cross_entropy(logits: torch.Tensor,
                                  labels: torch.Tensor,
                                  align_corners: bool = False) -> torch.Tensor:
    """The mean cross-entropy of ``[N, C, h, w]`` logits resized straight
    (bilinear) to ``[N, H, W]`` labels: CoTTA's ACDC loss.

    In deterministic mode through :func:`bilinear_resize` and
    :func:`deterministic_cross_entropy`: ``nll_loss2d`` and the resize's
    backward have no deterministic CUDA kernel.
    """
    size = tuple(labels.shape[-2:])
    if torch.are_deterministic_algorithms_enabled():
        return deterministic_cross_entropy(
            bilinear_resize(logits, size, align_corners), labels.long())
    logits = F.interpolate(logits, size=size, mode='bilinear',
                           align_corners=align_corners)
    return F.cross_entropy(logits, labels.long())


def deterministic_cross_entropy(logits: torch.Tensor, labels: torch.Tensor,
                                ignore_index: int = -100) -> torch.Tensor:
    """``F.cross_entropy(logits, labels, ignore_index=...)`` (the mean,
    NaN if every pixel is ignored) through log-softmax and ``gather``:
    deterministic on CUDA, unlike ``nll_loss2d``."""
    valid = labels != ignore_index
    index = torch.where(valid, labels, torch.zeros_like(labels))
    log_p = logits.log_softmax(dim=1).gather(1, index.unsqueeze(1))
    nll = -log_p.squeeze(1) * valid
    return nll.sum() / valid.sum()


def bilinear_resize(x: torch.Tensor, size: Tuple[int, int],
                    align_corners: bool = False) -> torch.Tensor:
    """``F.interpolate(x, size, mode='bilinear')`` as ``R_h @ x @ R_wᵀ``.

    The backward is two matmuls too, deterministic on CUDA, and lighter
    than the path ``F.interpolate`` takes there in deterministic mode (four
    full-size gathers, an index-put backward). Runs in float32 (float64
    kept) with autocast off, as ``F.interpolate`` does under autocast.
    """
    (h, w), (out_h, out_w) = x.shape[-2:], size
    with torch.autocast(x.device.type, enabled=False):
        x = x if x.dtype == torch.float64 else x.float()
        rows = interpolation_matrix(h, out_h, align_corners, x)
        cols = interpolation_matrix(w, out_w, align_corners, x)
        # the order of the two products with fewer multiplications
        width_first = h * w * out_w + out_h * h * out_w
        height_first = out_h * h * w + out_h * w * out_w
        if width_first <= height_first:
            return rows @ (x @ cols.T)
        return (rows @ x) @ cols.T


def interpolation_matrix(in_size: int, out_size: int, align_corners: bool,
                         like: torch.Tensor) -> torch.Tensor:
    """The ``[out, in]`` weights of 1-D linear interpolation, in ``like``'s
    dtype and device.

    PyTorch's rule (``area_pixel_compute_source_index``): output ``i``
    reads source ``s = (i + 0.5) in/out - 0.5`` clamped to ``[0, in - 1]``
    (``s = i (in-1)/(out-1)`` with ``align_corners``), weight ``1 - |s - j|``
    on the two nearest inputs ``j``.
    """
    dst = torch.arange(out_size, dtype=torch.float64, device=like.device)
    if align_corners:
        src = dst * ((in_size - 1) / (out_size - 1) if out_size > 1 else 0.)
    else:
        src = (dst + 0.5) * (in_size / out_size) - 0.5
    src = src.clamp(min=0, max=in_size - 1)
    grid = torch.arange(in_size, dtype=torch.float64, device=like.device)
    weights = (1 - (src[:, None] - grid[None, :]).abs()).clamp(min=0)
    return weights.to(like.dtype)
