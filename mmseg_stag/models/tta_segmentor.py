"""``TTAEncoderDecoder``: one forward pass gives logits *and* head features."""
from contextlib import contextmanager
from typing import Iterator, List, Optional, Tuple

import torch
import torch.nn as nn
from mmseg.models.segmentors import EncoderDecoder
from mmseg.registry import MODELS
from mmseg.utils import (ConfigType, OptConfigType, OptMultiConfig,
                         OptSampleList, SampleList)

#: ``[(features [N, D, h, w], logits [N, C, h, w]), ...]``, one pair per
#: forward of the decode head, at the head's own resolution.
HeadOutputs = List[Tuple[torch.Tensor, torch.Tensor]]


def _check_classifier(module: Optional[nn.Module], path: str,
                      head_name: str) -> nn.Conv2d:
    """Return ``module`` if it is a plain 1x1 conv classifier, else raise a
    ``ValueError`` that names ``path`` and what was found there."""
    if module is None:
        raise ValueError(
            f'TTAEncoderDecoder: classifier_name={path!r} does not name a '
            f'module of the segmentor (decode head: {head_name}); a head '
            'without a 1x1 classifier cannot give per-pixel features')
    if not isinstance(module, nn.Conv2d):
        raise ValueError(
            f'TTAEncoderDecoder: classifier_name={path!r} is a '
            f'{type(module).__name__} ({module!r}), not an nn.Conv2d: head '
            'without a 1x1 classifier (STAG needs a 1x1 conv whose weight is '
            '[C, D, 1, 1], applied to every pixel of the head features)')
    problems = []
    if tuple(module.kernel_size) != (1, 1):
        problems.append(f'kernel_size={tuple(module.kernel_size)}')
    if tuple(module.stride) != (1, 1):
        problems.append(f'stride={tuple(module.stride)}')
    if module.groups != 1:
        problems.append(f'groups={module.groups}')
    if module.padding not in ((0, 0), 'valid', 'same'):
        problems.append(f'padding={module.padding}')
    if problems:
        raise ValueError(
            f'TTAEncoderDecoder: classifier_name={path!r} is {module!r} '
            f"({', '.join(problems)}): head without a 1x1 classifier (STAG "
            'needs a plain 1x1 conv: kernel 1x1, stride 1, groups 1, no '
            'padding)')
    return module


@MODELS.register_module()
class TTAEncoderDecoder(EncoderDecoder):
    """An ``EncoderDecoder`` for online test-time adaptation.

    STAG (and TENT-style losses) need the classifier's input features ``h``
    and its logits ``z`` at the decode head's own resolution (``g = s h``
    holds only there, before any upsampling), and the adaptation loss must
    use the very forward pass that also makes the prediction.
    :meth:`inference_with_features` runs MMSeg's own ``inference`` (whole or
    slide) once while a forward hook on the 1x1 classifier records its
    ``(input, output)``: one pair for whole inference, one per crop for slide
    inference. Nothing runs twice, and the hook exists only during the call,
    so any decode head whose classifier is a 1x1 conv works.

    Without an adapter, :meth:`predict` is ``EncoderDecoder.predict``. When a
    test-time adaptation method is attached as ``tta_adapter`` (e.g. by
    ``TTAHook``), :meth:`predict` hands the batch to
    ``tta_adapter.adapt_and_predict(self, inputs, batch_img_metas)``, which
    must return ``seg_logits`` as :meth:`inference` does (at the padded input
    size); these then go through the usual ``postprocess_result`` (padding
    removal, flip, resize to ``ori_shape``, argmax).

    Args:
        backbone (ConfigType): The config for the backbone.
        decode_head (ConfigType): The config for the decode head.
        neck (OptConfigType): The config for the neck. Default: None.
        auxiliary_head (OptConfigType): The config for the auxiliary head.
            Default: None.
        train_cfg (OptConfigType): The config for training. Default: None.
        test_cfg (OptConfigType): The config for testing (``mode='whole'``
            or ``mode='slide'`` with ``crop_size`` and ``stride``).
            Default: None.
        data_preprocessor (OptConfigType): The config of the data
            preprocessor. Default: None.
        pretrained (str, optional): The path of the pretrained backbone.
            Default: None.
        init_cfg (OptMultiConfig): The weight initialization config.
            Default: None.
        classifier_name (str): Dotted module path of the decode head's 1x1
            classifier conv (weight ``[C, D, 1, 1]``). Default:
            ``'decode_head.conv_seg'`` (every MMSeg ``BaseDecodeHead``,
            including ``SegformerHead`` and ``NVSegformerHead``).
    """

    def __init__(self,
                 backbone: ConfigType,
                 decode_head: ConfigType,
                 neck: OptConfigType = None,
                 auxiliary_head: OptConfigType = None,
                 train_cfg: OptConfigType = None,
                 test_cfg: OptConfigType = None,
                 data_preprocessor: OptConfigType = None,
                 pretrained: Optional[str] = None,
                 init_cfg: OptMultiConfig = None,
                 classifier_name: str = 'decode_head.conv_seg'):
        super().__init__(
            backbone=backbone,
            decode_head=decode_head,
            neck=neck,
            auxiliary_head=auxiliary_head,
            train_cfg=train_cfg,
            test_cfg=test_cfg,
            data_preprocessor=data_preprocessor,
            pretrained=pretrained,
            init_cfg=init_cfg)
        if not isinstance(classifier_name, str) or not classifier_name:
            raise ValueError('TTAEncoderDecoder: classifier_name must be a '
                             'non-empty dotted module path, got '
                             f'{classifier_name!r}')
        self.classifier_name = classifier_name
        _check_classifier(self._find_module(classifier_name), classifier_name,
                          type(self.decode_head).__name__)
        # The test-time adaptation method (a plain object, not an
        # nn.Module, so that it never enters the state dict).
        self.tta_adapter = None

    def _find_module(self, path: str) -> Optional[nn.Module]:
        try:
            return self.get_submodule(path)
        except AttributeError:
            return None

    @property
    def classifier(self) -> nn.Conv2d:
        """The 1x1 classifier conv (``.weight`` ``[C, D, 1, 1]``,
        ``.bias`` ``[C]`` or None)."""
        return self.get_submodule(self.classifier_name)

    @contextmanager
    def _record_head_outputs(self) -> Iterator[HeadOutputs]:
        """Record ``(input[0], output)`` of every classifier forward while
        the context is open; the hook is removed on exit."""
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
        """``inference`` (whole or slide) plus the decode head's classifier
        inputs and outputs, from the same single forward pass.

        Args:
            inputs (Tensor): Input images ``[N, 3, H, W]`` (after the data
                preprocessor).
            batch_img_metas (List[dict]): Image meta info, as for
                ``inference`` (``ori_shape``, ``img_shape``, ``pad_shape``,
                ``padding_size``...).

        Returns:
            tuple: ``(seg_logits, head_outputs)``.

            - ``seg_logits`` (Tensor): exactly what ``self.inference``
              returns (``[N, C, H, W]``, at the padded input size; pass it to
              ``postprocess_result``).
            - ``head_outputs`` (List[Tuple[Tensor, Tensor]]): one
              ``(features [N, D, h, w], logits [N, C, h, w])`` pair per
              forward of the decode head, at the head's resolution (whole
              mode: one pair for the batch; slide mode: one per crop, in
              MMSeg's crop order). ``features`` is the classifier's input
              (after the head's dropout, an identity in eval mode) and
              ``classifier(features) == logits``. The tensors keep their
              autograd graph when called with gradients enabled.

        Raises:
            RuntimeError: the classifier did not run (``classifier_name``
                names a conv outside the inference path).
        """
        with self._record_head_outputs() as records:
            seg_logits = self.inference(inputs, batch_img_metas)
        if not records:
            raise RuntimeError(
                f'TTAEncoderDecoder: the classifier {self.classifier_name!r} '
                'did not run during inference; classifier_name must name the '
                "decode head's final 1x1 conv")
        return seg_logits, list(records)

    def predict(self,
                inputs: torch.Tensor,
                data_samples: OptSampleList = None) -> SampleList:
        """Predict, adapting first if ``tta_adapter`` is set.

        Args:
            inputs (Tensor): Inputs with shape ``(N, C, H, W)``.
            data_samples (List[:obj:`SegDataSample`], optional): The seg
                data samples with ``metainfo``.

        Returns:
            list[:obj:`SegDataSample`]: as ``EncoderDecoder.predict``
            (``seg_logits`` and ``pred_sem_seg``).
        """
        if self.tta_adapter is None:
            return super().predict(inputs, data_samples)
        if data_samples is not None:
            batch_img_metas = [s.metainfo for s in data_samples]
        else:
            batch_img_metas = [
                dict(
                    ori_shape=inputs.shape[2:],
                    img_shape=inputs.shape[2:],
                    pad_shape=inputs.shape[2:],
                    padding_size=[0, 0, 0, 0])
            ] * inputs.shape[0]
        seg_logits = self.tta_adapter.adapt_and_predict(
            self, inputs, batch_img_metas)
        return self.postprocess_result(seg_logits, data_samples)
