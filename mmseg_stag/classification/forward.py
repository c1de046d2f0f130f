"""The classifier layer of a model and a one-pass ``forward`` for the methods.

TTA methods call ``forward(model, inputs) -> (prediction, head_outputs)``
with ``head_outputs = [(features [N, D], logits [N, C])]`` (see
:mod:`mmseg_stag.methods.base`). For a classification network the features
are the classifier's input; :func:`make_forward` captures them with a
forward hook on the classifier during the model's own forward pass, so no
second forward is run and ``classifier(features) == logits`` exactly.
"""
from typing import Callable, List, Optional, Tuple

import torch
import torch.nn as nn

Forward = Callable[[nn.Module, torch.Tensor],
                   Tuple[torch.Tensor, List[Tuple[torch.Tensor,
                                                  torch.Tensor]]]]


def find_classifier(model: nn.Module,
                    name: Optional[str] = None) -> Tuple[str, nn.Module]:
    """``(name, module)`` of the classifier layer.

    Args:
        model: the network.
        name: the classifier's module name (e.g. ``'fc'``, ``'head'``);
            ``None``: the last ``nn.Linear`` in registration order (the
            classifier of torchvision ResNets, timm ResNets and ViTs, and
            RobustBench WideResNets).

    Raises:
        ValueError: no such module, or no ``nn.Linear`` in the model, or the
            named module has no ``[C, D]`` (or ``[C, D, 1, 1]``) weight.
    """
    if name is None:
        linears = [(n, m) for n, m in model.named_modules()
                   if isinstance(m, nn.Linear)]
        if not linears:
            raise ValueError(f'{type(model).__name__} has no nn.Linear layer:'
                             ' name the classifier in the config '
                             '(model.classifier=...)')
        return linears[-1]
    try:
        module = model.get_submodule(name)
    except AttributeError as err:
        linears = [n for n, m in model.named_modules()
                   if isinstance(m, nn.Linear)]
        raise ValueError(f'{type(model).__name__} has no module {name!r} '
                         f'(its nn.Linear layers: {linears})') from err
    weight = getattr(module, 'weight', None)
    if not isinstance(weight, torch.Tensor) or not (
            weight.dim() == 2 or
            (weight.dim() == 4 and weight.shape[2:] == (1, 1))):
        raise ValueError(f'classifier {name!r} ({type(module).__name__}) '
                         'needs a [C, D] or [C, D, 1, 1] weight')
    return name, module


def make_forward(classifier_name: str) -> Forward:
    """A ``forward(model, x)`` returning ``(logits, [(features, logits)])``.

    The classifier is looked up by name in whichever model is passed (the
    adapted model, a teacher copy, a reset copy), a hook records its input
    and output during one call of ``model(x)`` and is removed afterwards.
    The features keep their autograd graph, so a loss on them reaches the
    adapted parameters.

    Args:
        classifier_name: module name of the classifier in the model.
    """

    def forward(model: nn.Module, x: torch.Tensor):
        classifier = model.get_submodule(classifier_name)
        seen = {}

        def hook(module, args, output):
            seen['features'], seen['logits'] = args[0], output

        handle = classifier.register_forward_hook(hook)
        try:
            prediction = model(x)
        finally:
            handle.remove()
        if 'features' not in seen:
            raise RuntimeError(f'the classifier {classifier_name!r} was not '
                               'called by the forward pass')
        features = seen['features']
        if features.dim() != 2:
            raise ValueError(
                f'classifier {classifier_name!r} got an input of shape '
                f'{tuple(features.shape)}; a per-sample [N, D] input is '
                'needed')
        return prediction, [(features, seen['logits'])]

    return forward
