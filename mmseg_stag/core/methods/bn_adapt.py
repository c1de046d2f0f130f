from ..params import use_batch_statistics
from ..registry import METHODS
from .base import BaseMethod


@METHODS.register_module(name='bn_adapt')
class BNAdapt(BaseMethod):
    """BN Adapt: BatchNorm layers normalise with the test batch's statistics.

    No loss of its own; with STAG the update is ``beta_t L_STAG`` alone.
    """

    has_base_loss = False
    graph_capturable = True

    def set_modes(self, model):
        model.eval()
        use_batch_statistics(model)
