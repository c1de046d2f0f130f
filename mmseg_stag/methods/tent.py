import torch.nn.functional as F

from mmseg_stag.registry import TTA_METHODS
from .base import TTAMethod, mean_over_outputs, softmax_entropy


@TTA_METHODS.register_module(name=['TENT', 'tent'])
class TENT(TTAMethod):
    """TENT (Wang et al., ICLR 2021): minimise the prediction entropy.

    The normalisation layers' affine parameters are adapted; the model stays
    in evaluation mode (BatchNorm uses its running statistics), as in CoTTA's
    ACDC code.

    Args:
        loss (str): ``'entropy'`` (the paper's TENT, eq:ent, averaged over
            samples/pixels) or ``'pseudo_ce'`` (cross-entropy to the model's
            own argmax, as CoTTA's segmentation code does).
        **kwargs: see :class:`TTAMethod`.
    """

    LOSSES = ('entropy', 'pseudo_ce')

    def __init__(self, loss: str = 'entropy', **kwargs):
        if loss not in self.LOSSES:
            raise ValueError(f'TENT loss must be one of {self.LOSSES}, '
                             f'got {loss!r}')
        super().__init__(**kwargs)
        self.loss = loss

    def base_loss(self, head_outputs):
        if self.loss == 'entropy':
            return mean_over_outputs(
                lambda _, logits: softmax_entropy(logits).mean(),
                head_outputs)
        return mean_over_outputs(
            lambda _, logits: F.cross_entropy(logits,
                                              logits.detach().argmax(1)),
            head_outputs)
