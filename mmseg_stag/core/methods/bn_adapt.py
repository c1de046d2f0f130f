from ..registry import METHODS
from .base import BaseMethod


@METHODS.register_module(name='bn_adapt')
class BNAdapt(BaseMethod):
    """BN Adapt: BatchNorm layers normalise with the test batch's statistics
    (``bn_batch_stats``, which is what the method is, so always on).

    No loss of its own; with STAG the update is ``beta_t L_STAG`` alone,
    by ``optimizer`` on ``trainable`` (checked as TENT's).

    Raises:
        ValueError: If ``bn_batch_stats=False`` (that is Source), or
            ``optimizer`` or ``trainable`` is given without ``stag`` (no
            update uses them).
    """

    has_base_loss = False
    graph_capturable = True

    def __init__(self, bn_batch_stats: bool = True, **kwargs):
        if not bn_batch_stats:
            raise ValueError('bn_adapt is BatchNorm with test-batch '
                             'statistics: bn_batch_stats=False is the source '
                             "model (type='source')")
        super().__init__(bn_batch_stats=True, **kwargs)
