"""``TTAEncoderDecoder``: one forward pass gives logits *and* head features."""
from contextlib import contextmanager
from typing import List, Optional, Tuple

import torch
import torch.nn as nn
from mmseg.models.segmentors import EncoderDecoder
from mmseg.registry import MODELS
from mmseg.utils import OptSampleList, SampleList

HeadOutputs = List[Tuple[torch.Tensor, torch.Tensor]]


@MODELS.register_module()
class TTAEncoderDecoder(EncoderDecoder):
    """An ``EncoderDecoder`` for online test-time adaptation.

    STAG needs the classifier's input features ``h`` and its logits ``z`` at
    the head's own resolution (``g = s h`` holds only there), and the TTA loss
    must use the very forward pass that makes the prediction. A forward hook
    on the decode head's 1x1 classifier records ``(input, output)`` of every
    head forward: one pair for whole inference, one per crop for slide
    inference. Nothing runs twice.

    When a TTA method is attached (``tta_adapter``, set by ``TTAHook``),
    :meth:`predict` hands the batch to it: the method runs the forward with
    gradients, steps its optimizer and returns the logits computed *before*
    the step (predict-then-adapt).

    Args:
        classifier_name (str): dotted path of the 1x1 classifier conv.
            Default: ``'decode_head.conv_seg'`` (MMSeg heads and
            ``NVSegformerHead``).
        **kwargs: the arguments of ``EncoderDecoder``.
    """

    def __init__(self,
                 *args,
                 classifier_name: str = 'decode_head.conv_seg',
                 **kwargs):
        super().__init__(*args, **kwargs)
        self.classifier_name = classifier_name
        try:
            classifier = self.get_submodule(classifier_name)
        except AttributeError as err:
            raise ValueError(
                f'TTAEncoderDecoder: no module {classifier_name!r} '
                f'(classifier_name) in {type(self.decode_head).__name__}'
            ) from err
        if not (isinstance(classifier, nn.Conv2d)
                and tuple(classifier.kernel_size) == (1, 1)):
            raise ValueError(
                f'TTAEncoderDecoder: {classifier_name!r} must be a 1x1 '
                f'nn.Conv2d classifier (the head without a 1x1 classifier '
                f'cannot give per-pixel features), found {classifier!r}')
        self.tta_adapter = None

    @property
    def classifier(self) -> nn.Conv2d:
        """The 1x1 classifier conv (weight ``[C, D, 1, 1]``, bias ``[C]``)."""
        return self.get_submodule(self.classifier_name)

    @contextmanager
    def _record_head_outputs(self):
        records: HeadOutputs = []

        def hook(module, inputs, output):
            records.append((inputs[0], output))

        handle = self.classifier.register_forward_hook(hook)
        try:
            yield records
        finally:
            handle.remove()

    def inference_with_features(self, inputs: torch.Tensor,
                                batch_img_metas: List[dict]
                                ) -> Tuple[torch.Tensor, HeadOutputs]:
        """``inference`` (whole or slide) plus the head outputs.

        Returns:
            ``(seg_logits, head_outputs)``: ``seg_logits`` exactly as
            ``EncoderDecoder.inference`` returns them, and a list of
            ``(features [N, D, h, w], logits [N, C, h, w])`` at the head's
            resolution, one pair per decode-head forward. Autograd graphs are
            kept when called with gradients enabled.
        """
        with self._record_head_outputs() as records:
            seg_logits = self.inference(inputs, batch_img_metas)
        return seg_logits, list(records)

    def predict(self,
                inputs: torch.Tensor,
                data_samples: OptSampleList = None) -> SampleList:
        if self.tta_adapter is None:
            return super().predict(inputs, data_samples)
        if data_samples is not None:
            batch_img_metas = [s.metainfo for s in data_samples]
        else:
            batch_img_metas = [
                dict(ori_shape=inputs.shape[2:], img_shape=inputs.shape[2:],
                     pad_shape=inputs.shape[2:], padding_size=[0, 0, 0, 0])
            ] * inputs.shape[0]
        seg_logits = self.tta_adapter.adapt_and_predict(
            self, inputs, batch_img_metas)
        return self.postprocess_result(seg_logits, data_samples)
