"""EATA as the authors wrote it (github.com/mr-eggplant/EATA), transcribed
for the tests: ``update_model_probs`` and ``forward_and_adapt_eata`` of
``eata.py``; the Fisher loop of ``main.py`` recomputed by hand."""
import torch
import torch.nn.functional as F
from reference.entropy_reference import softmax_entropy


def ref_update_model_probs(current, new_probs):
    """``update_model_probs`` (``eata.py``)."""
    if current is None:
        if new_probs.size(0) == 0:
            return None
        with torch.no_grad():
            return new_probs.mean(0)
    if new_probs.size(0) == 0:
        with torch.no_grad():
            return current
    with torch.no_grad():
        return 0.9 * current + (1 - 0.9) * new_probs.mean(0)


def ref_forward_and_adapt_eata(x, model, optimizer, fishers, e_margin,
                               current_model_probs, fisher_alpha, d_margin):
    """``forward_and_adapt_eata`` (``eata.py``, ``@torch.enable_grad``).

    Returns ``(outputs, number of selected samples, number of reliable
    samples, updated model probs, loss)``."""
    outputs = model(x)
    entropys = softmax_entropy(outputs)
    filter_ids_1 = torch.where(entropys < e_margin)
    ids1 = filter_ids_1
    ids2 = torch.where(ids1[0] > -0.1)
    entropys = entropys[filter_ids_1]
    if current_model_probs is not None:
        cos = F.cosine_similarity(current_model_probs.unsqueeze(dim=0),
                                  outputs[filter_ids_1].softmax(1), dim=1)
        filter_ids_2 = torch.where(torch.abs(cos) < d_margin)
        entropys = entropys[filter_ids_2]
        ids2 = filter_ids_2
        updated_probs = ref_update_model_probs(
            current_model_probs,
            outputs[filter_ids_1][filter_ids_2].softmax(1))
    else:
        updated_probs = ref_update_model_probs(
            current_model_probs, outputs[filter_ids_1].softmax(1))
    coeff = 1 / (torch.exp(entropys.clone().detach() - e_margin))
    entropys = entropys.mul(coeff)
    loss = entropys.mean(0)
    if fishers is not None:
        ewc_loss = 0
        for name, param in model.named_parameters():
            if name in fishers:
                ewc_loss += fisher_alpha * (
                    fishers[name][0] * (param - fishers[name][1])**2).sum()
        loss += ewc_loss
    if x[ids1][ids2].size(0) != 0:
        loss.backward()
        optimizer.step()
    optimizer.zero_grad()
    return (outputs, entropys.size(0), filter_ids_1[0].size(0),
            updated_probs, loss)


def ref_fishers(model, params, names, batches):
    """The Fisher information of ``main.py`` by hand with
    ``autograd.grad``: the mean over batches of ``grad^2`` of the
    cross-entropy to the model's argmax; ``{name: (fisher, theta_0)}``."""
    sums = [torch.zeros_like(p) for p in params]
    for x in batches:
        out = model(x)
        loss = F.cross_entropy(out, out.argmax(1))
        grads = torch.autograd.grad(loss, params)
        sums = [s + g**2 for s, g in zip(sums, grads)]
    return {n: (s / len(batches), p.detach().clone())
            for n, s, p in zip(names, sums, params)}
