from ..params import use_batch_statistics
from ..registry import METHODS
from .base import BaseMethod


@METHODS.register_module(name='bn_adapt')
class BNAdapt(BaseMethod):
    """BN Adapt: BatchNorm layers normalise with the test batch's statistics.

    No loss of its own: without STAG there is no gradient step. With STAG the
    normalisation layers' affine parameters are updated by ``beta_t * L_STAG``
    alone (``L_base = 0`` in eq:total_objective).
    """

    has_base_loss = False

    def set_modes(self, model):
        model.eval()
        use_batch_statistics(model)
