"""Masked patch prediction: the paper's self-supervised objective (Sec. 4.6, Appendix B.1.2).

"We corrupt 50% of patch embeddings by either replacing their embeddings with a learnable [mask]
embedding (80%), a random other patch embedding (10%) or just keeping them as is (10%). [...]
Finally, we predict the 3-bit, mean color (i.e., 512 colors in total) of every corrupted patch
using their respective patch representations."

How the appendix's words become code here:

- **Where.** Corruption acts on the patch embeddings ``x_p E`` of Eq. 1, before the class token
  is prepended and E_pos added (as BERT replaces token embeddings and keeps position
  embeddings): :meth:`VisionTransformer.embed_patches` then finishes Eq. 1.
- **How many.** Exactly ``round(0.5 N)`` patches of every image are corrupted (a random
  permutation per image, as BERT picks its 15 %); each corrupted patch independently becomes
  [mask] with probability 0.8, another patch's embedding with 0.1, or stays with 0.1.
- **"A random other patch".** A patch drawn uniformly from every *other* patch of the batch
  (other images included), with its uncorrupted embedding. The paper does not say whether the
  donor comes from the same image; the batch is BERT's analogue of drawing a random vocabulary
  token.
- **Prediction.** A linear layer on the encoder's final-normalised output token of each
  corrupted patch; the loss is the cross-entropy over corrupted patches only (the 10 % kept
  unchanged included, as in BERT), averaged over them.
- **Targets** (``MPPConfig.target``): ``mean-color`` (the paper's reported choice: per-channel
  mean quantised to 3 bits, 512 classes; grayscale: the mean intensity at 3 bits, 8 classes,
  the same per-channel precision), ``downsized`` (the patch averaged to 4x4 cells, each a
  3-bit colour: 16 predictions of 512 classes), ``pixels`` (L2 regression on every pixel of
  the patch, in the model's input scale, [-1, 1] with the paper's normalisation).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vitkit.errors import VitkitError
from vitkit.models.vit import VisionTransformer
from vitkit.registry.model_config import ViTConfig
from vitkit.selfsup.objective_config import MPPConfig
from vitkit.selfsup.patches import (
    color_values,
    downsized_target,
    mean_color_target,
    paint_cells,
    patchify,
    unpatchify,
)


@dataclass
class Corruption:
    """Which patches of a batch are corrupted and how (all ``[B, N]``).

    corrupted: the patches the loss counts (= masked | replaced | kept).
    masked: replaced by the learnable [mask] embedding.
    replaced: replaced by the embedding of the patch ``donor`` (a flat index into ``B * N``).
    """

    corrupted: Tensor
    masked: Tensor
    replaced: Tensor
    donor: Tensor

    @property
    def kept(self) -> Tensor:
        return self.corrupted & ~self.masked & ~self.replaced


def corruption_plan(
    batch: int,
    num_patches: int,
    generator: torch.Generator,
    *,
    ratio: float = 0.5,
    mask_prob: float = 0.8,
    random_prob: float = 0.1,
) -> Corruption:
    """Draw the corruption of a batch (on the generator's device, CPU for vitkit's trainer)."""
    n_corrupt = int(round(ratio * num_patches))
    if not 0 < n_corrupt <= num_patches:
        raise VitkitError(
            f"corrupting {ratio:g} of {num_patches} patches corrupts {n_corrupt} of them; "
            "choose a ratio that corrupts at least one"
        )
    device = generator.device
    scores = torch.rand(batch, num_patches, generator=generator, device=device)
    chosen = scores.argsort(dim=1)[:, :n_corrupt]
    corrupted = torch.zeros(batch, num_patches, dtype=torch.bool, device=device)
    corrupted.scatter_(1, chosen, True)
    u = torch.rand(batch, num_patches, generator=generator, device=device)
    masked = corrupted & (u < mask_prob)
    replaced = corrupted & (u >= mask_prob) & (u < mask_prob + random_prob)
    total = batch * num_patches
    # Another patch of the batch, uniformly: draw from total - 1 and skip the patch itself.
    own = torch.arange(total, device=device).reshape(batch, num_patches)
    donor = torch.randint(0, max(total - 1, 1), (batch, num_patches), generator=generator,
                          device=device)  # fmt: skip
    donor = donor + (donor >= own).long()
    if total == 1:
        donor = own
    return Corruption(corrupted, masked, replaced, donor)


def apply_corruption(patches: Tensor, plan: Corruption, mask_token: Tensor) -> Tensor:
    """Patch embeddings ``[B, N, D]`` with the plan applied (a new tensor; gradients flow to
    the mask token, to the donors' embeddings and to the patches kept)."""
    b, n, d = patches.shape
    device = patches.device
    masked = plan.masked.to(device).unsqueeze(-1)
    replaced = plan.replaced.to(device).unsqueeze(-1)
    donors = patches.reshape(b * n, d)[plan.donor.to(device).reshape(-1)].reshape(b, n, d)
    out = torch.where(replaced, donors, patches)
    return torch.where(masked, mask_token.to(patches.dtype).expand_as(patches), out)


class MaskedPatchPrediction(nn.Module):
    """The objective's own weights (the [mask] embedding and the prediction head) and its loss.

    The encoder is passed in: it stays an ordinary :class:`VisionTransformer`, whose checkpoint
    fine-tunes and few-shot-evaluates like any other.
    """

    def __init__(self, cfg: MPPConfig, encoder_cfg: ViTConfig) -> None:
        super().__init__()
        if encoder_cfg.is_hybrid:
            raise VitkitError("masked patch prediction needs a plain ViT (patches of pixels)")
        self.cfg = cfg
        self.patch_size = encoder_cfg.patch_size
        self.channels = encoder_cfg.in_chans
        ph, pw = self.patch_size
        if cfg.target == "downsized" and (ph % cfg.grid or pw % cfg.grid):
            raise VitkitError(
                f"the downsized target needs the patch size {ph}x{pw} to be a multiple of "
                f"grid={cfg.grid}"
            )
        self.num_colors = 2 ** (cfg.bits * self.channels)
        if cfg.target == "mean-color":
            out = self.num_colors
        elif cfg.target == "downsized":
            out = cfg.grid * cfg.grid * self.num_colors
        else:
            out = self.channels * ph * pw
        self.mask_token = nn.Parameter(torch.zeros(encoder_cfg.width))
        nn.init.normal_(self.mask_token, std=0.02)
        self.head = nn.Linear(encoder_cfg.width, out)
        nn.init.xavier_uniform_(self.head.weight)
        nn.init.zeros_(self.head.bias)

    @property
    def is_classification(self) -> bool:
        return self.cfg.target != "pixels"

    def targets(self, x: Tensor, pixels: Tensor) -> Tensor:
        """Per-patch targets: class indices ``[B, N]`` / ``[B, N, cells]`` or pixels
        ``[B, N, C ph pw]`` (from the model input ``x``; colours from ``pixels`` in [0, 1])."""
        cfg = self.cfg
        if cfg.target == "mean-color":
            return mean_color_target(pixels, self.patch_size, cfg.bits)
        if cfg.target == "downsized":
            return downsized_target(pixels, self.patch_size, cfg.grid, cfg.bits)
        return patchify(x.float(), self.patch_size)

    def loss(self, tokens: Tensor, targets: Tensor, corrupted: Tensor) -> tuple[Tensor, Tensor]:
        """(loss, number of correct predictions) over the corrupted patches only.

        ``tokens``: the encoder's output of the patches ``[B, N, D]``; ``corrupted``: ``[B, N]``.
        Uncorrupted positions take no part: neither their tokens nor their targets.
        """
        where = corrupted.to(tokens.device)
        if not bool(where.any()):
            raise VitkitError("no corrupted patch in the batch")
        out = self.head(tokens[where]).float()  # [M, out]
        target = targets.to(tokens.device)[where]
        if self.cfg.target == "pixels":
            return F.mse_loss(out, target.float()), torch.zeros((), dtype=torch.long)
        logits = out.reshape(len(out), -1, self.num_colors)  # [M, cells, colours]
        target = target.reshape(len(out), -1)
        loss = F.cross_entropy(logits.flatten(0, 1), target.flatten())
        correct = (logits.argmax(-1) == target).sum() / target.shape[1]
        return loss, correct.detach()

    def forward(
        self, encoder: VisionTransformer, x: Tensor, pixels: Tensor, generator: torch.Generator
    ) -> tuple[Tensor, Tensor, int]:
        """(loss, correct predictions, predictions counted) for a batch of model inputs ``x``
        (normalised) whose pixels in [0, 1] are ``pixels``."""
        cfg = self.cfg
        patches = encoder.patch_embed(x)  # [B, N, D]
        b, n, _ = patches.shape
        plan = corruption_plan(
            b,
            n,
            generator,
            ratio=cfg.corrupt_ratio,
            mask_prob=cfg.mask_prob,
            random_prob=cfg.random_prob,
        )
        corrupted = apply_corruption(patches, plan, self.mask_token)
        tokens = encoder.encode(encoder.embed_patches(corrupted))
        tokens = tokens[:, encoder.cfg.num_prefix_tokens :]
        loss, correct = self.loss(tokens, self.targets(x, pixels), plan.corrupted)
        return loss, correct, int(plan.corrupted.sum())

    def _as_patches(
        self, values: Tensor, x: Tensor, to_pixels: Callable[[Tensor], Tensor]
    ) -> Tensor:
        """Targets or head outputs ``[B, N, ...]`` → patch pixels ``[B, N, C ph pw]`` in [0, 1]."""
        b, n = values.shape[:2]
        if self.cfg.target == "pixels":
            grid = (x.shape[-2] // self.patch_size[0], x.shape[-1] // self.patch_size[1])
            return patchify(
                to_pixels(unpatchify(values.float(), self.patch_size, grid)), self.patch_size
            )
        colors = color_values(values.reshape(b, n, -1), self.cfg.bits, self.channels)
        return paint_cells(colors, self.patch_size)

    @torch.no_grad()
    def preview(
        self,
        encoder: VisionTransformer,
        x: Tensor,
        to_pixels: Callable[[Tensor], Tensor],
        generator: torch.Generator,
    ) -> list[tuple[str, Tensor]]:
        """Rows of images in [0, 1]: the input, the corrupted input the encoder sees ([mask]
        grey, a replaced patch showing its donor), the targets and the predictions (both on
        the corrupted patches, the input elsewhere)."""
        cfg = self.cfg
        pixels = to_pixels(x)
        patches = encoder.patch_embed(x)
        b, n, _ = patches.shape
        plan = corruption_plan(
            b, n, generator, ratio=cfg.corrupt_ratio, mask_prob=cfg.mask_prob,
            random_prob=cfg.random_prob,
        )  # fmt: skip
        tokens = encoder.encode(
            encoder.embed_patches(apply_corruption(patches, plan, self.mask_token))
        )
        out = self.head(tokens[:, encoder.cfg.num_prefix_tokens :]).float()
        if self.is_classification:
            out = out.reshape(b, n, -1, self.num_colors).argmax(-1)
        shown = patchify(pixels, self.patch_size)
        where = plan.corrupted.to(x.device).unsqueeze(-1)
        seen = shown.reshape(b * n, -1)[plan.donor.to(x.device).reshape(-1)].reshape(shown.shape)
        seen = torch.where(plan.replaced.to(x.device).unsqueeze(-1), seen, shown)
        seen = torch.where(plan.masked.to(x.device).unsqueeze(-1), torch.full_like(seen, 0.5), seen)
        target = torch.where(where, self._as_patches(self.targets(x, pixels), x, to_pixels), shown)
        pred = torch.where(where, self._as_patches(out, x, to_pixels), shown)
        grid = encoder.cfg.grid_size
        return [
            (name, unpatchify(p, self.patch_size, grid))
            for name, p in (("input", shown), ("corrupted", seen), ("target", target),
                            ("prediction", pred))
        ]  # fmt: skip
