"""``HeadProbe``: the prediction and the classifier's inputs and outputs."""
from typing import Any, Callable, List, Optional, Tuple

import torch
import torch.nn as nn

#: Prediction kinds: where a classifier predicts, per sample (logits
#: ``[N, C]``) or per pixel (``[N, C, H, W]``).
PREDICTION_KINDS = ('per_sample', 'per_pixel')

HeadOutputs = List[Tuple[torch.Tensor, torch.Tensor]]


def check_prediction_kind(kind: str) -> str:
    """Return ``kind``; raise ``ValueError`` if not a prediction kind."""
    if kind not in PREDICTION_KINDS:
        raise ValueError(f'prediction_kind must be one of {PREDICTION_KINDS},'
                         f' got {kind!r}')
    return kind


class HeadProbe:
    """Record the ``(input, output)`` of a model's classifier in one call.

    Args:
        head_layer (str, optional): Dotted module name of the classifier
            (the head layer), e.g. ``'decode_head.conv_seg'``. ``None``: the
            model's last ``nn.Linear`` (per sample only).
        prediction_kind (str): ``'per_sample'`` or ``'per_pixel'``.

    It records, nothing else: mixed precision is the task adapter's
    (``TaskAdapter.autocast_dtype``), around the pass (:func:`run_probe`).
    """

    def __init__(self,
                 head_layer: Optional[str] = None,
                 prediction_kind: str = 'per_sample'):
        self.prediction_kind = check_prediction_kind(prediction_kind)
        if head_layer is None and prediction_kind == 'per_pixel':
            raise ValueError('a per-pixel probe needs head_layer, the '
                             "classifier's module name (e.g. "
                             "'decode_head.conv_seg')")
        if head_layer is not None and (not isinstance(head_layer, str)
                                       or not head_layer):
            raise ValueError('head_layer must be a dotted module name, got '
                             f'{head_layer!r}')
        self.head_layer = head_layer

    def find(self, model: nn.Module) -> Tuple[str, nn.Module]:
        """Return ``(name, module)`` of the classifier in ``model``;
        ``ValueError`` if there is no such module or it is no classifier."""
        name = self.head_layer
        if name is None:
            linears = [(n, m) for n, m in model.named_modules()
                       if isinstance(m, nn.Linear)]
            if not linears:
                raise ValueError(
                    f'{type(model).__name__} has no nn.Linear layer: name '
                    'the classifier in the config (test_cfg.head_layer=...)')
            name, module = linears[-1]
        else:
            try:
                module = model.get_submodule(name)
            except AttributeError as err:
                candidates = [n for n, m in model.named_modules()
                              if isinstance(m, (nn.Linear, nn.Conv2d))]
                raise ValueError(
                    f'{type(model).__name__} has no module {name!r} (the '
                    'classifier); name its final 1x1 conv / linear layer '
                    f'(its linear and conv layers: {candidates[-8:]})'
                ) from err
        if self.prediction_kind == 'per_pixel':
            return name, check_pixel_classifier(module, name)
        weight = getattr(module, 'weight', None)
        if not isinstance(weight, torch.Tensor) or weight.dim() != 2:
            raise ValueError(f'classifier {name!r} ({type(module).__name__}) '
                             'needs a [C, D] weight (a linear layer on [N, D] '
                             'features)')
        return name, module

    def classifier(self, model: nn.Module) -> nn.Module:
        """The classifier module of ``model``."""
        return self.find(model)[1]

    def __call__(self, model: nn.Module, inputs: Any,
                 run: Optional[Callable[[Any], Any]] = None
                 ) -> Tuple[Any, HeadOutputs]:
        """Run ``model`` (or ``run``, e.g. a segmentor's ``inference`` with
        its metainfo bound) once on ``inputs``; return ``(prediction,
        [(features, logits), ...])``, one pair per classifier call, with
        their autograd graphs."""
        name, module = self.find(model)
        records: HeadOutputs = []

        def hook(_, args, output):
            records.append((args[0], output))

        handle = module.register_forward_hook(hook)
        try:
            prediction = model(inputs) if run is None else run(inputs)
        finally:
            handle.remove()
        if not records:
            raise RuntimeError(f'the classifier {name!r} did not run during '
                               "the model's forward pass; name the module "
                               'that computes the logits')
        want = 2 if self.prediction_kind == 'per_sample' else 4
        for features, _ in records:
            if features.dim() != want:
                raise ValueError(
                    f'classifier {name!r} got an input of shape '
                    f'{tuple(features.shape)}; {self.prediction_kind} outputs '
                    f'need {want}-d features')
        return prediction, records


def run_probe(probe: HeadProbe, model: nn.Module, inputs: Any,
              run: Optional[Callable[[Any], Any]] = None,
              autocast_dtype: Optional[torch.dtype] = None
              ) -> Tuple[Any, HeadOutputs]:
    """``probe``'s pass of ``model`` on ``inputs`` (:meth:`HeadProbe.
    __call__`), under ``torch.autocast`` of ``autocast_dtype`` (the task
    adapter's) ended with the pass: autocast caches its casts of the
    weights, so a forward after an update in the same region would read
    the old ones. Under autocast the prediction and the logits come back
    in float32 (the losses run outside autocast), the features in the
    autocast dtype (a float32 copy would be ``D``-sized)."""
    if autocast_dtype is None:
        return probe(model, inputs, run)
    device = inputs.device.type if torch.is_tensor(inputs) else (
        'cuda' if torch.cuda.is_available() else 'cpu')
    try:
        with torch.autocast(device_type=device, dtype=autocast_dtype):
            prediction, records = probe(model, inputs, run)
    finally:
        # an enclosing autocast region would keep the weights' casts
        torch.clear_autocast_cache()
    return to_float32(prediction), [(f, to_float32(z)) for f, z in records]


def to_float32(x: Any) -> Any:
    """``x`` as float32 if it is a half-precision tensor, else ``x``."""
    if torch.is_tensor(x) and x.dtype in (torch.float16, torch.bfloat16):
        return x.float()
    return x


def check_pixel_classifier(module: nn.Module, name: str) -> nn.Conv2d:
    """Raise ``ValueError`` unless the classifier is a plain 1x1 conv."""
    if not isinstance(module, nn.Conv2d):
        raise ValueError(
            f'classifier {name!r} is a {type(module).__name__} ({module!r}), '
            'not an nn.Conv2d: head without a 1x1 classifier (STAG needs a '
            '1x1 conv whose weight is [C, D, 1, 1], applied to every pixel '
            'of the head features)')
    problems = [f'{key}={value}' for key, value, fine in (
        ('kernel_size', tuple(module.kernel_size), [(1, 1)]),
        ('stride', tuple(module.stride), [(1, 1)]),
        ('groups', module.groups, [1]),
        ('padding', module.padding, [(0, 0), 'valid', 'same']))
        if value not in fine]
    if problems:
        raise ValueError(
            f"classifier {name!r} is {module!r} ({', '.join(problems)}): "
            'head without a 1x1 classifier (STAG needs a plain 1x1 conv: '
            'kernel 1x1, stride 1, groups 1, no padding)')
    return module
