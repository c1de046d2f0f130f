"""EATA (Niu et al., ICML 2022): efficient anti-forgetting adaptation."""
import math
from typing import Dict, Optional, Tuple

import torch
import torch.nn.functional as F

from ..losses import flatten_logits, softmax_entropy
from ..registry import METHODS, check_range
from .sample_filtering import SampleFilteringMethod


def update_model_probs(current: Optional[torch.Tensor],
                       new_probs: torch.Tensor) -> Optional[torch.Tensor]:
    """Return the moving average ``p_bar`` of the selected probabilities;
    follows EATA's eata.py (update_model_probs)."""
    new_probs = new_probs.detach()
    if new_probs.size(0) == 0:
        return current
    if current is None:
        return new_probs.mean(0)
    return 0.9 * current + (1 - 0.9) * new_probs.mean(0)


@METHODS.register_module(name='eata')
class EATA(SampleFilteringMethod):
    """EATA: reliable, non-redundant entropy minimisation with EWC.

    Follows EATA's eata.py (forward_and_adapt_eata); the options and their
    defaults: docs/methods.md (EATA). ``**kwargs``: see :class:`BaseMethod`.

    Raises:
        ValueError: If a margin is not positive or ``fisher_alpha < 0``.
    """

    repr_fields = ('entropy_margin', 'd_margin', 'fisher_alpha')
    # saved so that a resumed run skips fit_source
    state_attributes = SampleFilteringMethod.state_attributes + (
        'model_probs', 'fishers')

    def __init__(self,
                 entropy_margin: float = 0.4,
                 d_margin: float = 0.05,
                 fisher_alpha: float = 2000.0,
                 **kwargs):
        check_range('> 0', entropy_margin=entropy_margin, d_margin=d_margin)
        check_range('>= 0', fisher_alpha=fisher_alpha)
        super().__init__(**kwargs)
        self.entropy_margin = float(entropy_margin)
        self.d_margin = float(d_margin)
        self.fisher_alpha = float(fisher_alpha)
        self.e_margin: Optional[float] = None  # E0, set by configure
        self.num_classes: Optional[int] = None
        self.model_probs: Optional[torch.Tensor] = None  # p_bar
        #: ``{param name: (fisher, theta_0)}``, set by :meth:`fit_source`
        self.fishers: Optional[Dict[str, Tuple[torch.Tensor,
                                               torch.Tensor]]] = None

    @property
    def needs_source_data(self) -> bool:
        """Whether clean batches are needed (``fisher_alpha > 0``)."""
        return self.fisher_alpha > 0

    def configure(self, model, task_adapter):
        super().configure(model, task_adapter)
        self.num_classes = int(self.classifier.weight.shape[0])
        self.e_margin = self.entropy_margin * math.log(self.num_classes)
        self.model_probs = None
        self.fishers = None

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        # a state file is read onto the CPU: back to the parameters' device
        self.model_probs = None if state['model_probs'] is None else \
            state['model_probs'].to(self.params[0][1])
        self.load_source_statistics(state['fishers'])

    def source_statistics(self) -> Optional[dict]:
        """The Fisher information and ``theta_0`` of :meth:`fit_source`."""
        return self.fishers

    def load_source_statistics(self, fishers: Optional[dict]) -> None:
        """Use :meth:`source_statistics` of an earlier fit, on the
        parameters' devices and dtypes."""
        params = dict(self.params)
        self.fishers = None if fishers is None else {
            name: tuple(t.to(params[name]) for t in pair)
            for name, pair in fishers.items()}

    def fit_source(self, batches) -> None:
        """Compute the Fisher information of the trainable parameters on
        clean source batches (the Fisher loop of EATA's main.py)."""
        if self.fisher_alpha == 0:
            return  # ETA
        self.check_configured()
        sums = {name: torch.zeros_like(p) for name, p in self.params}
        seen = set()
        num_batches = 0
        for batch in batches:
            self.optimizer.zero_grad(set_to_none=True)
            with torch.enable_grad():
                head_outputs = self.task_adapter.forward(
                    self.model, batch).head_outputs
                logits = flatten_logits(head_outputs)
                targets = logits.detach().max(1)[1]
                F.cross_entropy(logits, targets).backward()
            for name, p in self.params:
                if p.grad is not None:
                    sums[name] += p.grad.detach() ** 2
                    seen.add(name)
            num_batches += 1
        self.optimizer.zero_grad(set_to_none=True)
        if num_batches == 0:
            raise ValueError('EATA.fit_source got no batches')
        self.fishers = {name: (sums[name] / num_batches,
                               p.detach().clone())
                        for name, p in self.params if name in seen}

    def ewc_term(self) -> torch.Tensor:
        """Return ``fisher_alpha * sum F (theta - theta_0)^2``."""
        if self.fishers is None:
            raise RuntimeError('EATA has no Fisher information: call '
                               'fit_source(clean_batches) first')
        ref = self.params[0][1]
        total = torch.zeros((), dtype=ref.dtype, device=ref.device)
        names = [n for n, _ in self.params if n in self.fishers]
        if not names:
            return total
        params = dict(self.params)
        # one kernel per operation for all parameters, not one per tensor
        diffs = torch._foreach_sub([params[n] for n in names],
                                   [self.fishers[n][1] for n in names])
        terms = torch._foreach_mul([self.fishers[n][0] for n in names],
                                   torch._foreach_pow(diffs, 2))
        for term in terms:
            total = total + self.fisher_alpha * term.sum()
        return total

    def select(self, logits: torch.Tensor
               ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Apply both filters and update ``p_bar`` for one batch of logits
        ``[M, C]``; return the entropies, reliable and selected masks."""
        entropies = softmax_entropy(logits)
        reliable = entropies < self.e_margin
        selected = reliable.clone()
        with torch.no_grad():
            probs = logits.detach()[reliable].softmax(1)
            if self.model_probs is not None:
                cos = F.cosine_similarity(self.model_probs.unsqueeze(0),
                                          probs, dim=1)
                keep = cos.abs() < self.d_margin
                selected[reliable.nonzero(as_tuple=True)[0]] = keep
                probs = probs[keep]
            self.model_probs = update_model_probs(self.model_probs, probs)
        return entropies, reliable, selected

    def base_loss(self, batch, fwd) -> Optional[torch.Tensor]:
        """Return the weighted entropy of the selected samples (+ EWC)."""
        logits = flatten_logits(fwd.head_outputs)
        entropies, reliable, selected = self.select(logits)
        if self.record_selection(fwd.stats, reliable, selected) == 0:
            return None
        ent = entropies[selected]
        coeff = 1 / torch.exp(ent.detach() - self.e_margin)
        loss = ent.mul(coeff).mean(0)
        if self.fishers is not None:
            ewc = self.ewc_term()
            fwd.stats.extra['loss_ewc'] = ewc.detach()
            loss = loss + ewc
        return loss

    def forward_and_adapt(self, batch, beta=None):
        if self.fisher_alpha > 0 and self.fishers is None:
            raise RuntimeError(
                f'EATA with fisher_alpha={self.fisher_alpha} needs the '
                'Fisher information of clean source data: call '
                'fit_source(clean_batches) before adapt, or set '
                'fisher_alpha=0 (ETA)')
        return super().forward_and_adapt(batch, beta)
