"""DeYO as the authors wrote it (github.com/Jhyun17/DeYO), transcribed for
the tests: ``DeYO.forward_and_adapt_deyo`` of ``methods/deyo.py`` with
``aug_type='patch'``; its einops patch shuffle written as a loop over the
patches."""
import torch
from reference.entropy_reference import softmax_entropy


def ref_shuffle_patches(x, perm, patch_len=4):
    """The ``aug_type='patch'`` shuffle of ``forward_and_adapt_deyo``
    (``rearrange`` to patches, ``x_prime[arange, perm_idx]``, ``rearrange``
    back) one patch at a time: output patch ``k`` (grid row
    ``k // patch_len``, column ``k % patch_len``) is the input patch
    ``perm[b, k]``."""
    n, _, h, w = x.shape
    ph, pw = h // patch_len, w // patch_len
    out = torch.empty_like(x)
    for b in range(n):
        for k in range(patch_len * patch_len):
            src = int(perm[b, k])
            r, c = divmod(k, patch_len)
            sr, sc = divmod(src, patch_len)
            out[b, :, r * ph:(r + 1) * ph, c * pw:(c + 1) * pw] = \
                x[b, :, sr * ph:(sr + 1) * ph, sc * pw:(sc + 1) * pw]
    return out


def ref_forward_and_adapt_deyo(x, model, optimizer, deyo_margin, margin,
                               plpd_threshold, reweight_ent=1,
                               reweight_plpd=1, patch_len=4,
                               stag_term=None):
    """``forward_and_adapt_deyo`` (images whose side is a multiple of
    ``patch_len``, so no resize); ``stag_term(model, x)`` (optional)
    returns a loss added to the authors' loss (covering every sample), in
    which case the step happens even when a filter is empty.

    Returns ``(outputs, backward, final_backward, loss)`` (the numbers of
    samples kept by the first and by both filters)."""
    outputs = model(x)
    optimizer.zero_grad()
    extra = None if stag_term is None else stag_term(model, x)
    entropys = softmax_entropy(outputs)
    filter_ids_1 = torch.where(entropys < deyo_margin)
    entropys = entropys[filter_ids_1]
    backward = len(entropys)
    loss = None
    final_backward = 0
    if backward > 0:
        x_prime = x[filter_ids_1].detach()
        perm_idx = torch.argsort(torch.rand(x_prime.shape[0],
                                            patch_len * patch_len), dim=-1)
        x_prime = ref_shuffle_patches(x_prime, perm_idx, patch_len)
        with torch.no_grad():
            outputs_prime = model(x_prime)
        prob_outputs = outputs[filter_ids_1].softmax(1)
        prob_outputs_prime = outputs_prime.softmax(1)
        cls1 = prob_outputs.argmax(dim=1)
        plpd = (torch.gather(prob_outputs, dim=1, index=cls1.reshape(-1, 1))
                - torch.gather(prob_outputs_prime, dim=1,
                               index=cls1.reshape(-1, 1)))
        plpd = plpd.reshape(-1)
        filter_ids_2 = torch.where(plpd > plpd_threshold)
        entropys = entropys[filter_ids_2]
        final_backward = len(entropys)
        if final_backward > 0:
            plpd = plpd[filter_ids_2]
            if reweight_ent or reweight_plpd:
                coeff = (reweight_ent * (1 / (torch.exp(
                    ((entropys.clone().detach()) - margin)))) +
                    reweight_plpd * (1 / (torch.exp(
                        -1. * plpd.clone().detach()))))
                entropys = entropys.mul(coeff)
            loss = entropys.mean(0)
    if extra is not None:
        loss = extra if loss is None else loss + extra
    if loss is not None:
        loss.backward()
        optimizer.step()
    optimizer.zero_grad()
    return outputs, backward, final_backward, loss
