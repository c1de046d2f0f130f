"""DeYO (Lee et al., ICLR 2024): destroy your object, entropy and PLPD."""
import math
from typing import Optional, Union

import torch
import torch.nn.functional as F

from ..losses import (HeadOutputs, flatten_logits, pixels_as_rows,
                      softmax_entropy)
from ..params import exclude_modules
from ..registry import METHODS, check_range
from ..task_adapter import Batch, ForwardPass
from .sample_filtering import SampleFilteringMethod
from .sar import SAR_AUTHORS_EXCLUDE  # DeYO's collect_params is SAR's


def patch_shuffle(x: torch.Tensor,
                  patch_len: int = 4,
                  generator: Optional[torch.Generator] = None,
                  perm: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Shuffle the ``patch_len x patch_len`` patches of each image of
    ``x [N, C, H, W]``; follows DeYO's methods/deyo.py (``aug_type='patch'``).

    ``perm`` ``[N, patch_len**2]``: output patch ``k`` is input patch
    ``perm[b, k]`` (row-major); None: drawn with ``generator``.
    """
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
    patches = x.reshape(n, c, patch_len, ph, patch_len, pw).permute(
        0, 2, 4, 1, 3, 5).reshape(n, num, c, ph, pw)
    perm = perm.to(device=x.device, dtype=torch.long)
    patches = patches[torch.arange(n, device=x.device).unsqueeze(-1), perm]
    out = patches.reshape(n, patch_len, patch_len, c, ph, pw).permute(
        0, 3, 1, 4, 2, 5).reshape(n, c, th, tw)
    if resized:
        out = F.interpolate(out, size=(h, w), mode='bilinear',
                            align_corners=False)
    return out


@METHODS.register_module(name='deyo')
class DeYO(SampleFilteringMethod):
    """DeYO: entropy minimisation on samples whose prediction needs shape.

    Follows DeYO's methods/deyo.py (forward_and_adapt_deyo); the options and
    their defaults: docs/methods.md (DeYO). ``**kwargs``: see
    :class:`BaseMethod`.

    Raises:
        ValueError: If a margin or ``patch_len`` is not positive.
    """

    repr_fields = ('deyo_margin', 'reweight_margin', 'plpd_threshold',
                   'patch_len', 'reweight_ent', 'reweight_plpd',
                   'exclude_regex')

    def __init__(self,
                 deyo_margin: float = 0.5,
                 reweight_margin: float = 0.4,
                 plpd_threshold: float = 0.2,
                 patch_len: int = 4,
                 reweight_ent: Union[bool, float] = 1.0,
                 reweight_plpd: Union[bool, float] = 1.0,
                 exclude_regex: Optional[str] = SAR_AUTHORS_EXCLUDE,
                 **kwargs):
        check_range('> 0', deyo_margin=deyo_margin,
                    reweight_margin=reweight_margin)
        if int(patch_len) != patch_len or patch_len < 1:
            raise ValueError(f'patch_len must be a positive integer, got '
                             f'{patch_len}')
        super().__init__(**kwargs)
        self.deyo_margin = float(deyo_margin)
        self.reweight_margin = float(reweight_margin)
        self.plpd_threshold = float(plpd_threshold)
        self.patch_len = int(patch_len)
        self.reweight_ent = float(reweight_ent)
        self.reweight_plpd = float(reweight_plpd)
        self.exclude_regex = exclude_regex
        self.num_classes: Optional[int] = None
        self.ent_margin: Optional[float] = None  # tau_Ent (absolute)
        self.margin_e0: Optional[float] = None  # Ent_0 (absolute)

    def configure(self, model, task_adapter):
        super().configure(model, task_adapter)
        exclude_modules(self, self.exclude_regex)
        self.num_classes = int(self.classifier.weight.shape[0])
        self.ent_margin = self.deyo_margin * math.log(self.num_classes)
        self.margin_e0 = self.reweight_margin * math.log(self.num_classes)

    def select(self, batch: Batch, head_outputs: HeadOutputs):
        """Apply both filters to one batch (its images are shuffled); return
        the entropies, the reliable and selected masks ``[M]`` and the PLPD
        of the reliable samples (None if there is none)."""
        logits = flatten_logits(head_outputs)
        inputs = batch.inputs
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
                prob_prime = self.shuffled_pixel_probs(batch, head_outputs,
                                                       reliable)
            else:
                x_prime = patch_shuffle(inputs[reliable].detach(),
                                        self.patch_len)
                prob_prime = self.task_adapter.forward(
                    self.model, batch, x_prime).output.softmax(1)
            prob = logits.detach()[reliable].softmax(1)
            cls1 = prob.argmax(dim=1, keepdim=True)
            plpd = (prob.gather(1, cls1) -
                    prob_prime.gather(1, cls1)).reshape(-1)
        keep = plpd > self.plpd_threshold
        selected[reliable.nonzero(as_tuple=True)[0]] = keep
        return entropies, reliable, selected, plpd

    def shuffled_pixel_probs(self, batch: Batch, head_outputs: HeadOutputs,
                             reliable: torch.Tensor) -> torch.Tensor:
        """The shuffled images' probabilities at the reliable pixels."""
        num_images = head_outputs[0][1].shape[0]
        image_of_pixel = torch.cat([
            torch.arange(num_images, device=reliable.device
                         ).repeat_interleave(z[0, 0].numel())
            for _, z in head_outputs])
        has_reliable = torch.zeros(num_images, dtype=torch.bool,
                                   device=reliable.device)
        has_reliable[image_of_pixel[reliable]] = True
        x_prime = patch_shuffle(batch.inputs[has_reliable].detach(),
                                self.patch_len)
        outputs_prime = self.task_adapter.forward(
            self.model, batch, x_prime).head_outputs
        shapes = [tuple(z.shape) for _, z in head_outputs]
        num_shuffled = int(has_reliable.sum())
        shapes_prime = [tuple(z.shape) for _, z in outputs_prime]
        if shapes_prime != [(num_shuffled, ) + s[1:] for s in shapes]:
            raise ValueError(
                f'DeYO: the shuffled images gave head outputs of shapes '
                f'{shapes_prime}, the batch {shapes} ({num_shuffled} of '
                f'{num_images} images shuffled)')
        rows = []  # one row per pixel; zero for unshuffled images
        for _, z_prime in outputs_prime:
            prob = z_prime.detach().softmax(1)
            full = prob.new_zeros((num_images, ) + prob.shape[1:])
            full[has_reliable] = prob
            rows.append(pixels_as_rows(full))
        return torch.cat(rows)[reliable]

    def base_loss(self, batch: Batch,
                  fwd: ForwardPass) -> Optional[torch.Tensor]:
        """Return the weighted entropy of the samples both filters keep."""
        entropies, reliable, selected, plpd = self.select(batch,
                                                          fwd.head_outputs)
        if self.record_selection(fwd.stats, reliable, selected) == 0:
            return None
        ent = entropies[selected]
        plpd = plpd[selected[reliable]]
        if self.reweight_ent or self.reweight_plpd:
            coeff = (self.reweight_ent *
                     (1 / torch.exp(ent.detach() - self.margin_e0)) +
                     self.reweight_plpd * (1 / torch.exp(-1. * plpd)))
            ent = ent.mul(coeff)
        return ent.mean(0)
