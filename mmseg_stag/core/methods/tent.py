from ..losses import (mean_over_outputs, pseudo_label_cross_entropy,
                      softmax_entropy)
from ..registry import METHODS
from .base import BaseMethod


@METHODS.register_module(name='tent')
class TENT(BaseMethod):
    """TENT (Wang et al., ICLR 2021): minimise the prediction entropy.

    The normalisation layers' affine parameters are adapted; the model stays
    in evaluation mode (BatchNorm uses its running statistics), as in CoTTA's
    ACDC code.

    Args:
        loss (str): ``'entropy'`` (the paper's TENT, eq:ent, averaged over
            samples/pixels) or ``'pseudo_ce'`` (cross-entropy to the model's
            own argmax at the head's resolution).
        **kwargs: see :class:`BaseMethod`.
    """

    LOSSES = dict(entropy=lambda logits: softmax_entropy(logits).mean(),
                  pseudo_ce=pseudo_label_cross_entropy)

    def __init__(self, loss: str = 'entropy', **kwargs):
        if loss not in self.LOSSES:
            raise ValueError(f'tent loss must be one of {tuple(self.LOSSES)}'
                             f', got {loss!r}')
        super().__init__(**kwargs)
        self.loss_type = loss

    def base_loss(self, ctx):
        fn = self.LOSSES[self.loss_type]
        return mean_over_outputs(lambda _, logits: fn(logits),
                                 ctx.head_outputs)
