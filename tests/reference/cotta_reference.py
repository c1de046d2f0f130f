"""CoTTA as the authors wrote it (github.com/qinenergy/cotta), transcribed
for the tests: ``softmax_entropy``, ``update_ema_variables`` and the
``CoTTA`` class (``copy_model_and_optimizer``, ``forward_and_adapt`` with
``steps=1``) of ``cifar/cotta.py``, and ``softmax_entropy`` and
``CoTTA.forward_and_adapt`` of ``imagenet/cotta.py``; Adam (or a given
optimizer) on the trainable weights and biases (as their ``collect_params``
lists them)."""
import copy

import torch


def ref_softmax_entropy(x, x_ema):
    """``softmax_entropy(x, x_ema)`` (``cifar/cotta.py``): the student's
    cross-entropy to the teacher."""
    return -(x_ema.softmax(1) * x.log_softmax(1)).sum(1)


def ref_symmetric_softmax_entropy(x, x_ema):
    """``softmax_entropy(x, x_ema)`` (``imagenet/cotta.py``): the symmetric
    cross-entropy between student and teacher."""
    return -0.5*(x_ema.softmax(1) * x.log_softmax(1)).sum(1) - \
        0.5*(x.softmax(1) * x_ema.log_softmax(1)).sum(1)


def ref_update_ema_variables(ema_model, model, alpha_teacher):
    """``update_ema_variables`` (``cifar/cotta.py``)."""
    for ema_param, param in zip(ema_model.parameters(), model.parameters()):
        ema_param.data[:] = alpha_teacher * ema_param[:].data[:] + \
            (1 - alpha_teacher) * param[:].data[:]
    return ema_model


class RefCoTTA:
    """``CoTTA`` of the authors (``steps=1``); ``lazy`` skips the augmented
    forwards when their mean is not used; ``extra(model, x)`` is added to
    the loss.

    Args:
        model: copied (the authors' ``configure_model`` already applied).
        transform: the augmentation (their ``get_tta_transforms()``).
        mt, rst, ap: ``mt_alpha``, ``rst_m``, ``ap``.
        n_augs: augmented teacher forwards (32 in their code).
        lr: Adam learning rate, betas (0.9, 0.999).
        optim: ``optim(params) -> optimizer`` instead of Adam.
    """

    def __init__(self, model, transform, mt, rst, ap, n_augs, lr,
                 lazy=False, extra=None, optim=None):
        self.model = copy.deepcopy(model)
        params = []
        for nm, m in self.model.named_modules():
            for np_, p in m.named_parameters():
                if np_ in ['weight', 'bias'] and p.requires_grad:
                    params.append(p)
        self.optimizer = optim(params) if optim is not None else \
            torch.optim.Adam(params, lr=lr, betas=(0.9, 0.999))
        self.model_state = copy.deepcopy(self.model.state_dict())
        self.model_anchor = copy.deepcopy(self.model)
        self.model_ema = copy.deepcopy(self.model)
        for param in self.model_ema.parameters():
            param.detach_()
        self.transform, self.mt, self.rst, self.ap = transform, mt, rst, ap
        self.n_augs, self.lazy, self.extra = n_augs, lazy, extra

    def forward_and_adapt(self, x):
        """``CoTTA.forward_and_adapt``; returns ``(outputs_ema, loss)``."""
        outputs = self.model(x)
        anchor_prob = torch.nn.functional.softmax(self.model_anchor(x),
                                                  dim=1).max(1)[0]
        standard_ema = self.model_ema(x)
        outputs_emas = []
        if not self.lazy or anchor_prob.mean(0) < self.ap:
            for i in range(self.n_augs):
                outputs_ = self.model_ema(self.transform(x)).detach()
                outputs_emas.append(outputs_)
        if anchor_prob.mean(0) < self.ap:
            outputs_ema = torch.stack(outputs_emas).mean(0)
        else:
            outputs_ema = standard_ema
        loss = (ref_softmax_entropy(outputs, outputs_ema)).mean(0)
        if self.extra is not None:
            loss = loss + self.extra(self.model, x)
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad()
        self.model_ema = ref_update_ema_variables(self.model_ema, self.model,
                                                  self.mt)
        self.stochastic_restore()
        return outputs_ema, loss

    def stochastic_restore(self):
        """The ``# Stochastic restore`` block (the same in both files; the
        ImageNet file's literal 0.001 is ``rst``)."""
        for nm, m in self.model.named_modules():
            for npp, p in m.named_parameters():
                if npp in ['weight', 'bias'] and p.requires_grad:
                    mask = (torch.rand(p.shape) < self.rst).double()
                    with torch.no_grad():
                        p.data = self.model_state[f"{nm}.{npp}"] * mask + \
                            p * (1. - mask)


class RefCoTTAImageNet(RefCoTTA):
    """``CoTTA.forward_and_adapt`` of ``imagenet/cotta.py``: the symmetric
    loss, the augmented forwards only when used, the teacher put in train
    mode; its literals are parameters here: ``ap`` (0.1), ``mt`` (0.999),
    ``rst`` (0.001), ``n_augs`` (32). Arguments as :class:`RefCoTTA`
    (``lazy`` is ignored: this code is lazy)."""

    def forward_and_adapt(self, x):
        """``CoTTA.forward_and_adapt``; returns ``(outputs_ema, loss)``."""
        outputs = self.model(x)
        self.model_ema.train()
        # Teacher Prediction
        anchor_prob = torch.nn.functional.softmax(self.model_anchor(x),
                                                  dim=1).max(1)[0]
        standard_ema = self.model_ema(x)
        # Augmentation-averaged Prediction
        N = self.n_augs
        outputs_emas = []
        to_aug = anchor_prob.mean(0) < self.ap
        if to_aug:
            for i in range(N):
                outputs_ = self.model_ema(self.transform(x)).detach()
                outputs_emas.append(outputs_)
        # Threshold choice discussed in supplementary
        if to_aug:
            outputs_ema = torch.stack(outputs_emas).mean(0)
        else:
            outputs_ema = standard_ema
        # Student update
        loss = (ref_symmetric_softmax_entropy(outputs,
                                              outputs_ema.detach())).mean(0)
        if self.extra is not None:
            loss = loss + self.extra(self.model, x)
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad()
        # Teacher update
        self.model_ema = ref_update_ema_variables(
            ema_model=self.model_ema, model=self.model,
            alpha_teacher=self.mt)
        # Stochastic restore
        self.stochastic_restore()
        return outputs_ema, loss
