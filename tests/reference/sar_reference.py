"""SAR as the authors wrote it (github.com/mr-eggplant/SAR), transcribed for
the tests: ``sam.py`` (class ``SAM``, from davda54/sam), and of ``sar.py``
the class ``SAR`` (``forward``, ``reset``), ``forward_and_adapt_sar``,
``update_ema``, ``copy_model_and_optimizer`` and
``load_model_and_optimizer``; the optimizer is built as their ``main.py``
builds it: ``SAM(params, torch.optim.SGD, lr=lr, momentum=0.9)``."""
from copy import deepcopy

import numpy as np
import torch
from reference.entropy_reference import softmax_entropy


class RefSAM(torch.optim.Optimizer):
    """``SAM`` of the authors' ``sam.py`` (``step`` with a closure left
    out: SAR never calls it)."""

    def __init__(self, params, base_optimizer, rho=0.05, adaptive=False,
                 **kwargs):
        assert rho >= 0.0, f"Invalid rho, should be non-negative: {rho}"

        defaults = dict(rho=rho, adaptive=adaptive, **kwargs)
        super(RefSAM, self).__init__(params, defaults)

        self.base_optimizer = base_optimizer(self.param_groups, **kwargs)
        self.param_groups = self.base_optimizer.param_groups
        self.defaults.update(self.base_optimizer.defaults)

    @torch.no_grad()
    def first_step(self, zero_grad=False):
        grad_norm = self._grad_norm()
        for group in self.param_groups:
            scale = group["rho"] / (grad_norm + 1e-12)

            for p in group["params"]:
                if p.grad is None:
                    continue
                self.state[p]["old_p"] = p.data.clone()
                e_w = (torch.pow(p, 2) if group["adaptive"] else 1.0) * \
                    p.grad * scale.to(p)
                p.add_(e_w)  # climb to the local maximum "w + e(w)"

        if zero_grad:
            self.zero_grad()

    @torch.no_grad()
    def second_step(self, zero_grad=False):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                p.data = self.state[p]["old_p"]  # back to "w" from "w + e(w)"

        self.base_optimizer.step()  # do the actual "sharpness-aware" update

        if zero_grad:
            self.zero_grad()

    def _grad_norm(self):
        shared_device = self.param_groups[0]["params"][0].device
        norm = torch.norm(
            torch.stack([
                ((torch.abs(p) if group["adaptive"] else 1.0) * p.grad)
                .norm(p=2).to(shared_device)
                for group in self.param_groups for p in group["params"]
                if p.grad is not None
            ]),
            p=2)
        return norm

    def load_state_dict(self, state_dict):
        super().load_state_dict(state_dict)
        self.base_optimizer.param_groups = self.param_groups


def update_ema(ema, new_data):
    """``update_ema`` (``sar.py``)."""
    if ema is None:
        return new_data
    else:
        with torch.no_grad():
            return 0.9 * ema + (1 - 0.9) * new_data


class RefSAR:
    """The authors' ``SAR`` (``steps=1``, not episodic) on a copy of a
    model; optionally ``+ beta * stag(features, logits, W, b)`` on each
    forward (the base term left out when its filter is empty instead of
    being NaN).

    Args:
        model: copied; the copy is adapted (``self.model``).
        forward: ``forward(model, x) -> (logits, [(features, logits)])``.
        params: ``params(model) -> [trainable parameters]``.
        classifier: ``classifier(model) -> module`` (for the STAG term).
        lr: SGD learning rate (momentum 0.9).
        rho: SAM's ``rho``.
        stag: ``stag(features, logits, W, b)`` or ``None``.
        reset_constant: the literal ``0.2`` of ``forward_and_adapt_sar``
            (``if ema < 0.2``), a parameter here so that a test can keep
            recovery away (0) or make it fire.
    """

    def __init__(self, model, forward, params, classifier, lr, rho=0.05,
                 stag=None, reset_constant=0.2):
        self.forward = forward
        self.classifier = classifier
        self.model = deepcopy(model)
        self.model.requires_grad_(False)
        self.params = params(self.model)
        for p in self.params:
            p.requires_grad_(True)
        # main.py: SAM(params, base_optimizer, lr=args.lr, momentum=0.9)
        self.optimizer = RefSAM(self.params, torch.optim.SGD, rho=rho,
                                lr=lr, momentum=0.9)
        self.stag = stag
        self.reset_constant = reset_constant
        self.ema = None
        # SAR.__init__: copy_model_and_optimizer
        self.model_state = deepcopy(self.model.state_dict())
        self.optimizer_state = deepcopy(self.optimizer.state_dict())

    # ------------------------------------------------------------------
    def step(self, x, margin, beta=0.0):
        """``SAR.forward`` (``steps=1``): one ``forward_and_adapt_sar``,
        then ``reset()`` if flagged, then ``self.ema = ema``; returns
        ``(outputs, record)``."""
        outputs, ema, reset_flag, rec = self.forward_and_adapt_sar(
            x, margin, self.ema, beta)
        if reset_flag:
            self.reset()
        self.ema = ema  # update moving average value of loss
        rec['reset'] = reset_flag
        return outputs, rec

    def reset(self):
        """``SAR.reset``: ``load_model_and_optimizer`` then ``ema = None``."""
        self.model.load_state_dict(self.model_state, strict=True)
        self.optimizer.load_state_dict(self.optimizer_state)
        self.ema = None

    # ------------------------------------------------------------------
    def _stag(self, feats, logits, beta):
        head = self.classifier(self.model)
        return beta * self.stag(feats, logits, head.weight, head.bias)

    def _loss(self, feats, logits, ent, ids, beta):
        loss = ent[ids].mean(0)  # NaN when empty, as in the authors' code
        if self.stag is None:
            return loss
        l_stag = self._stag(feats, logits, beta)
        return l_stag if len(ids[0]) == 0 else loss + l_stag

    def forward_and_adapt_sar(self, x, margin, ema, beta):
        """``forward_and_adapt_sar`` (plus records and the STAG term);
        returns ``(outputs, ema, reset_flag, record)``."""
        rec = {}
        optimizer = self.optimizer
        optimizer.zero_grad()
        _, [(f1, outputs)] = self.forward(self.model, x)
        entropys = softmax_entropy(outputs)
        filter_ids_1 = torch.where(entropys < margin)
        loss = self._loss(f1, outputs, entropys, filter_ids_1, beta)
        loss.backward()

        optimizer.first_step(zero_grad=True)
        rec['perturbed'] = [p.detach().clone() for p in self.params]
        rec['e_w'] = [p.detach() - optimizer.state[p]['old_p']
                      for p in self.params]
        _, [(f2, out2)] = self.forward(self.model, x)
        entropys2 = softmax_entropy(out2)
        entropys2 = entropys2[filter_ids_1]  # second time forward
        filter_ids_2 = torch.where(entropys2 < margin)
        loss_second = entropys2[filter_ids_2].mean(0)
        if not np.isnan(loss_second.item()):
            ema = update_ema(ema, loss_second.item())
        if self.stag is not None:
            l2 = self._stag(f2, out2, beta)
            loss_second = (l2 if len(filter_ids_2[0]) == 0 else
                           loss_second + l2)

        loss_second.backward()
        optimizer.second_step(zero_grad=True)

        # perform model recovery
        reset_flag = False
        if ema is not None:
            if ema < self.reset_constant:
                reset_flag = True

        rec.update(n1=len(filter_ids_1[0]), n2=len(filter_ids_2[0]),
                   loss1=loss.item(), loss2=loss_second.item(), ema=ema)
        return outputs.detach(), ema, reset_flag, rec
