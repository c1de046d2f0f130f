"""DeYO (Lee et al., ICLR 2024): destroy your object, entropy and PLPD.

Follows the authors' code (github.com/Jhyun17/DeYO, ``methods/deyo.py``
``forward_and_adapt_deyo`` with ``aug_type='patch'``, ``collect_params``;
defaults of ``config.py``/``main.py``); on segmentation outputs every pixel
is a sample (see :class:`DeYO`).
"""
import math
from typing import Optional, Union

import torch
import torch.nn.functional as F

from ..losses import flatten_outputs, softmax_entropy
from ..registry import METHODS
from .base import BatchContext, SampleFilteringMethod

#: Module names the authors' ``collect_params`` never adapts (substring
#: tests on module names, as in their code, inherited from SAR): the last
#: stage (``layer4`` of ResNets, ``blocks.9``-``blocks.11`` of ViT-B) and
#: the final ``norm``.
DEYO_AUTHORS_EXCLUDE = r'layer4|blocks\.9|blocks\.10|blocks\.11|norm\.|^norm$'


def patch_shuffle(x: torch.Tensor,
                  patch_len: int = 4,
                  generator: Optional[torch.Generator] = None,
                  perm: Optional[torch.Tensor] = None) -> torch.Tensor:
    """DeYO's object-destroying transform (``aug_type='patch'``).

    The images are cut into a ``patch_len x patch_len`` grid of patches
    (``patch_len`` is the number of patches per row/column, the authors'
    ``--patch_len``), the ``patch_len**2`` patches of each image are
    permuted independently, and the grid is reassembled. Patch ``k`` is the
    one at grid row ``k // patch_len``, column ``k % patch_len``; the
    output's patch ``k`` is the input's patch ``perm[b, k]``.

    When ``H`` or ``W`` is not a multiple of ``patch_len`` the images are
    first resized (bilinear, ``align_corners=False``, no antialiasing: the
    tensor ``Resize`` of torchvision 0.11, which the authors pin) to
    ``(patch_len * (H // patch_len), patch_len * (W // patch_len))`` and
    resized back afterwards. (The authors size both sides from the width,
    i.e. assume square images.)

    Args:
        x: images ``[N, C, H, W]``.
        patch_len: patches per row and per column.
        generator: for the permutation ``argsort(rand(N, patch_len**2))``,
            drawn on the CPU; ``None``: torch's global generator (as the
            authors).
        perm: ``[N, patch_len**2]`` permutations to use instead of a draw.
    """
    if x.dim() != 4:
        raise ValueError(f'patch_shuffle needs images [N, C, H, W], got '
                         f'shape {tuple(x.shape)}')
    n, c, h, w = x.shape
    th, tw = patch_len * (h // patch_len), patch_len * (w // patch_len)
    if patch_len < 1 or th == 0 or tw == 0:
        raise ValueError(f'cannot cut {h}x{w} images into {patch_len}x'
                         f'{patch_len} patches')
    num = patch_len * patch_len
    if perm is None:
        perm = torch.argsort(torch.rand(n, num, generator=generator), dim=-1)
    if tuple(perm.shape) != (n, num):
        raise ValueError(f'perm must have shape {(n, num)}, got '
                         f'{tuple(perm.shape)}')
    resized = (th, tw) != (h, w)
    if resized:
        x = F.interpolate(x, size=(th, tw), mode='bilinear',
                          align_corners=False)
    ph, pw = th // patch_len, tw // patch_len
    # 'b c (ps1 h) (ps2 w) -> b (ps1 ps2) c h w'
    patches = x.reshape(n, c, patch_len, ph, patch_len, pw).permute(
        0, 2, 4, 1, 3, 5).reshape(n, num, c, ph, pw)
    perm = perm.to(device=x.device, dtype=torch.long)
    patches = patches[torch.arange(n, device=x.device).unsqueeze(-1), perm]
    # 'b (ps1 ps2) c h w -> b c (ps1 h) (ps2 w)'
    out = patches.reshape(n, patch_len, patch_len, c, ph, pw).permute(
        0, 3, 1, 4, 2, 5).reshape(n, c, th, tw)
    if resized:
        out = F.interpolate(out, size=(h, w), mode='bilinear',
                            align_corners=False)
    return out


@METHODS.register_module(name='deyo')
class DeYO(SampleFilteringMethod):
    """DeYO: entropy minimisation on samples whose prediction depends on
    the object's shape.

    Per batch (authors' ``forward_and_adapt_deyo``, ``aug_type='patch'``),
    with per-sample logits ``z`` of the forward pass (with gradients),
    ``p = softmax(z)``, entropies ``H``:

    1. filter 1: ``H < deyo_margin * ln C``;
    2. ``x'`` = the kept images, patch-shuffled (:func:`patch_shuffle`,
       one ``torch.rand`` draw from the global generator);
       ``p' = softmax(model(x'))`` without gradients (same model, same
       mode);
    3. ``PLPD = p[y] - p'[y]``, ``y = argmax p``;
       filter 2: ``PLPD > plpd_threshold``;
    4. ``L_base = mean_{both filters}(w * H)``, ``w = reweight_ent /
       exp(H - entropy_margin * ln C) + reweight_plpd / exp(-PLPD)``
       (detached; with both reweights zero/False, ``w = 1``).

    An empty filter gives no base loss: without STAG there is no backward
    pass and no optimizer step (as the authors); with STAG the update uses
    ``beta_t * L_STAG`` alone, which covers every sample of the forward
    pass. ``adapt`` returns the forward pass's logits (before the update).
    The batch's stats hold ``num_reliable`` (filter 1) and ``num_selected``
    (both filters).

    Segmentation (``'per_pixel'`` outputs; no code of the authors exists),
    as ``DeYOContinual`` of stanfc/MLMP (``adapt/deyo_continual.py``):
    every pixel of the head's output ``[N, C, h, w]`` is a sample
    (:func:`~mmseg_stag.core.losses.flatten_outputs`, all crops' pixels
    concatenated). Filter 1 per pixel; ``x'``: the images holding at least
    one pixel of filter 1 (a pixel's input is its image: the authors'
    ``x[filter_ids_1]``), patch-shuffled by :func:`patch_shuffle`
    (one permutation per image, one ``torch.rand`` draw), forwarded
    without gradients through the same probe; ``PLPD = p[y] - p'[y]`` per
    pixel, ``p'`` the shuffled image's prediction at the *same*
    head-output location (as MLMP; it does not follow the moved patch),
    ``y`` the pixel's argmax before shuffling; filter 2, weights and loss
    as above per pixel (mean over the pixels of both filters).
    ``num_reliable``, ``num_selected`` and the stream counts count pixels.

    Args:
        deyo_margin (float): ``tau_Ent`` as a fraction of ``ln C``.
            Default: 0.5.
        entropy_margin (float): ``Ent_0`` of the weights as a fraction of
            ``ln C``. Default: 0.4.
        plpd_threshold (float): ``tau_PLPD``. Default: 0.2.
        patch_len (int): patches per row/column. Default: 4.
        reweight_ent, reweight_plpd (bool or float): factors of the two
            weight terms. Default: 1 (True).
        exclude_regex (str, optional): trainable parameters whose *module*
            name matches (``re.search``) stay frozen. Default: the authors'
            ``collect_params`` exclusion :data:`DEYO_AUTHORS_EXCLUDE`;
            ``None``: every parameter chosen by ``trainable``.
        optimizer (dict): default SGD lr 0.00025, momentum 0.9 (authors'
            ResNet setting for batch 64).
        **kwargs: see :class:`BaseMethod` (``stag``, ``trainable``, ...).
    """

    supported_outputs = ('per_sample', 'per_pixel')

    def __init__(self,
                 deyo_margin: float = 0.5,
                 entropy_margin: float = 0.4,
                 plpd_threshold: float = 0.2,
                 patch_len: int = 4,
                 reweight_ent: Union[bool, float] = 1.0,
                 reweight_plpd: Union[bool, float] = 1.0,
                 exclude_regex: Optional[str] = DEYO_AUTHORS_EXCLUDE,
                 optimizer: Optional[dict] = None,
                 **kwargs):
        if not deyo_margin > 0:
            raise ValueError(f'deyo_margin must be > 0, got {deyo_margin}')
        if not entropy_margin > 0:
            raise ValueError(
                f'entropy_margin must be > 0, got {entropy_margin}')
        if int(patch_len) != patch_len or patch_len < 1:
            raise ValueError(f'patch_len must be a positive integer, got '
                             f'{patch_len}')
        super().__init__(
            optimizer=optimizer or dict(type='SGD', lr=0.00025,
                                        momentum=0.9),
            **kwargs)
        self.deyo_margin = float(deyo_margin)
        self.entropy_margin = float(entropy_margin)
        self.plpd_threshold = float(plpd_threshold)
        self.patch_len = int(patch_len)
        self.reweight_ent = float(reweight_ent)
        self.reweight_plpd = float(reweight_plpd)
        self.exclude_regex = exclude_regex
        self.output: Optional[str] = None  # set by configure
        self.num_classes: Optional[int] = None
        self.ent_margin: Optional[float] = None  # tau_Ent (absolute)
        self.margin_e0: Optional[float] = None  # Ent_0 (absolute)

    def configure(self, model, classifier, output='per_sample'):
        super().configure(model, classifier, output)
        self.output = output
        self.exclude_modules(self.exclude_regex)
        self.num_classes = int(classifier.weight.shape[0])
        self.ent_margin = self.deyo_margin * math.log(self.num_classes)
        self.margin_e0 = self.entropy_margin * math.log(self.num_classes)

    # ------------------------------------------------------------------
    def select(self, head_outputs, inputs: torch.Tensor, forward):
        """Both filters of one batch.

        Args:
            head_outputs: ``[(features, logits), ...]`` of the forward pass
                (per-pixel logits: every pixel a sample).
            inputs: the images ``[N, C, H, W]`` of that pass.
            forward: ``forward(model, x) -> (prediction, head_outputs)``.

        Returns ``(entropies [M], reliable [M], selected [M], plpd)`` over
        the ``M`` samples (pixels, in
        :func:`~mmseg_stag.core.losses.flatten_outputs` order): ``plpd``
        holds the PLPD of the reliable ones (``None`` when none is
        reliable); ``selected`` marks those kept by both filters.
        """
        _, logits = flatten_outputs(head_outputs, 'DeYO',
                                    self.output or self.supported_outputs)
        per_pixel = head_outputs[0][1].dim() == 4
        entropies = softmax_entropy(logits)
        reliable = entropies < self.ent_margin
        selected = torch.zeros_like(reliable)
        if not bool(reliable.any()):
            return entropies, reliable, selected, None
        num_images = head_outputs[0][1].shape[0] if per_pixel else \
            logits.shape[0]
        if not torch.is_tensor(inputs) or inputs.dim() != 4 or \
                inputs.shape[0] != num_images:
            shape = tuple(inputs.shape) if torch.is_tensor(inputs) else \
                type(inputs).__name__
            raise ValueError(
                f'DeYO needs the batch of images [N, C, H, W] of the '
                f'{num_images} {"images" if per_pixel else "logits"}, got '
                f'{shape}')
        with torch.no_grad():
            if per_pixel:
                prob_prime = self.shuffled_pixel_probs(
                    head_outputs, inputs, forward, reliable)
            else:
                x_prime = patch_shuffle(inputs[reliable].detach(),
                                        self.patch_len)
                logits_prime, _ = forward(self.model, x_prime)
                prob_prime = logits_prime.softmax(1)
            prob = logits.detach()[reliable].softmax(1)
            cls1 = prob.argmax(dim=1, keepdim=True)
            plpd = (prob.gather(1, cls1) -
                    prob_prime.gather(1, cls1)).reshape(-1)
        keep = plpd > self.plpd_threshold
        selected[reliable.nonzero(as_tuple=True)[0]] = keep
        return entropies, reliable, selected, plpd

    def shuffled_pixel_probs(self, head_outputs, inputs, forward,
                             reliable: torch.Tensor) -> torch.Tensor:
        """``softmax`` of the patch-shuffled images' logits at the reliable
        pixels' locations, ``[num reliable, C]``.

        The images holding a reliable pixel are shuffled (one permutation
        each) and forwarded; each pixel is read at its own head-output
        location in its own (now shuffled) image.
        """
        num_images = head_outputs[0][1].shape[0]
        image_of_pixel = torch.cat([
            torch.arange(num_images, device=reliable.device
                         ).repeat_interleave(z[0, 0].numel())
            for _, z in head_outputs])
        has_reliable = torch.zeros(num_images, dtype=torch.bool,
                                   device=reliable.device)
        has_reliable[image_of_pixel[reliable]] = True
        x_prime = patch_shuffle(inputs[has_reliable].detach(),
                                self.patch_len)
        _, outputs_prime = forward(self.model, x_prime)
        shapes = [tuple(z.shape) for _, z in head_outputs]
        num_shuffled = int(has_reliable.sum())
        shapes_prime = [tuple(z.shape) for _, z in outputs_prime]
        if shapes_prime != [(num_shuffled, ) + s[1:] for s in shapes]:
            raise ValueError(
                f'DeYO: the shuffled images gave head outputs of shapes '
                f'{shapes_prime}, the batch {shapes} ({num_shuffled} of '
                f'{num_images} images shuffled)')
        maps = []  # [N, C, h, w] per crop; zero for unshuffled images
        for _, z_prime in outputs_prime:
            prob = z_prime.detach().softmax(1)
            full = prob.new_zeros((num_images, ) + prob.shape[1:])
            full[has_reliable] = prob
            maps.append((full, full))  # (features unused)
        _, prob_prime = flatten_outputs(maps, 'DeYO', 'per_pixel')
        return prob_prime[reliable]

    def base_loss(self, ctx: BatchContext) -> Optional[torch.Tensor]:
        """Weighted entropy of the samples (pixels) kept by both filters;
        ``None`` when none is kept. Runs the PLPD forward on
        ``ctx.inputs``."""
        entropies, reliable, selected, plpd = self.select(
            ctx.head_outputs, ctx.inputs, ctx.forward)
        ctx.kept = selected
        if self.record_selection(ctx, reliable, selected) == 0:
            return None
        ent = entropies[selected]
        plpd = plpd[selected[reliable]]
        if self.reweight_ent or self.reweight_plpd:
            coeff = (self.reweight_ent *
                     (1 / torch.exp(ent.detach() - self.margin_e0)) +
                     self.reweight_plpd * (1 / torch.exp(-1. * plpd)))
            ent = ent.mul(coeff)
        return ent.mean(0)

    def __repr__(self) -> str:
        return (super().__repr__()[:-1] +
                f', deyo_margin={self.deyo_margin}, '
                f'entropy_margin={self.entropy_margin}, '
                f'plpd_threshold={self.plpd_threshold}, '
                f'patch_len={self.patch_len}, '
                f'reweight_ent={self.reweight_ent}, '
                f'reweight_plpd={self.reweight_plpd}, '
                f'exclude_regex={self.exclude_regex!r})')
