"""SAR as the authors wrote it (github.com/mr-eggplant/SAR), transcribed for
the tests: ``forward_and_adapt_sar`` of ``sar.py`` with the non-adaptive SAM
of ``sam.py`` (``first_step``/``second_step``) written out around
``torch.optim.SGD``, as ``collect_params`` + ``SAM(params, SGD, lr=...,
momentum=0.9)`` build it."""
import copy
import math

import torch

from reference.entropy_reference import softmax_entropy


class RefSAR:
    """The authors' ``SAR.forward_and_adapt_sar`` step with their SAM
    (rho 0.05 by default, non-adaptive) around ``torch.optim.SGD`` on
    ``params(model)``; optionally ``+ beta * stag(features, logits, W, b)``
    on each forward (the base term left out when its filter is empty
    instead of being NaN).

    Args:
        model: copied; the copy is adapted (``self.model``).
        forward: ``forward(model, x) -> (logits, [(features, logits)])``.
        params: ``params(model) -> [trainable parameters]``.
        classifier: ``classifier(model) -> module`` (for the STAG term).
        lr: SGD learning rate (momentum 0.9).
    """

    def __init__(self, model, forward, params, classifier, lr, rho=0.05,
                 stag=None):
        self.forward = forward
        self.classifier = classifier
        self.model = copy.deepcopy(model)
        self.model.requires_grad_(False)
        self.params = params(self.model)
        for p in self.params:
            p.requires_grad_(True)
        self.sgd = torch.optim.SGD(self.params, lr, momentum=0.9)
        self.rho = rho
        self.stag = stag
        self.ema = None

    def _stag(self, feats, logits, beta):
        head = self.classifier(self.model)
        return beta * self.stag(feats, logits, head.weight, head.bias)

    def _loss(self, feats, logits, ent, ids, beta):
        loss = ent[ids].mean(0)  # NaN when empty, as in the authors' code
        if self.stag is None:
            return loss
        l_stag = self._stag(feats, logits, beta)
        return l_stag if len(ids[0]) == 0 else loss + l_stag

    def step(self, x, margin, beta=0.0):
        """One ``forward_and_adapt_sar`` call (reset_constant_em never
        reached); returns ``(outputs, record)``."""
        rec = {}
        self.sgd.zero_grad()
        _, [(f1, outputs)] = self.forward(self.model, x)
        entropys = softmax_entropy(outputs)
        filter_ids_1 = torch.where(entropys < margin)
        loss = self._loss(f1, outputs, entropys, filter_ids_1, beta)
        loss.backward()
        # SAM.first_step (sam.py)
        with torch.no_grad():
            grad_norm = torch.norm(torch.stack(
                [p.grad.norm(p=2) for p in self.params
                 if p.grad is not None]), p=2)
            scale = self.rho / (grad_norm + 1e-12)
            old = [p.data.clone() for p in self.params]
            rec['e_w'] = [p.grad * scale for p in self.params]
            for p in self.params:
                p.add_(p.grad * scale)
        rec['perturbed'] = [p.detach().clone() for p in self.params]
        self.sgd.zero_grad()
        _, [(f2, out2)] = self.forward(self.model, x)
        entropys2 = softmax_entropy(out2)[filter_ids_1]
        filter_ids_2 = torch.where(entropys2 < margin)
        loss_second = entropys2[filter_ids_2].mean(0)
        if not math.isnan(loss_second.item()):
            self.ema = (loss_second.item() if self.ema is None else
                        0.9 * self.ema + 0.1 * loss_second.item())
        if self.stag is not None:
            l2 = self._stag(f2, out2, beta)
            loss_second = (l2 if len(filter_ids_2[0]) == 0 else
                           loss_second + l2)
        loss_second.backward()
        # SAM.second_step (sam.py)
        for p, o in zip(self.params, old):
            p.data = o
        self.sgd.step()
        self.sgd.zero_grad()
        rec.update(n1=len(filter_ids_1[0]), n2=len(filter_ids_2[0]),
                   loss1=loss.item(), loss2=loss_second.item())
        return outputs.detach(), rec
