from mmseg_stag.registry import TTA_METHODS
from .base import TTAMethod, use_batch_statistics


@TTA_METHODS.register_module(name=['BNAdapt', 'bn_adapt'])
class BNAdapt(TTAMethod):
    """BN Adapt: BatchNorm layers normalise with the test batch's statistics.

    No loss of its own: without STAG there is no gradient step. With STAG the
    normalisation layers' affine parameters are updated by ``beta_t * L_STAG``
    alone (``L_base = 0`` in eq:total_objective).
    """

    has_base_loss = False

    def configure(self, model, classifier):
        super().configure(model, classifier)
        use_batch_statistics(model)

    def set_modes(self, model):
        model.eval()
        use_batch_statistics(model)
