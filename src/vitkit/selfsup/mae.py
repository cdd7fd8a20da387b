"""Masked autoencoder (He et al., "Masked Autoencoders Are Scalable Vision Learners", 2022),
beside the paper's masked patch prediction because it is what users now expect.

- A random ``mask_ratio`` (75 %) of every image's patches is hidden: the patches are embedded
  and get their position embeddings, then only the visible ones (and the class token, with its
  position embedding) go through the encoder, an ordinary :class:`VisionTransformer`.
- The decoder (its own width and depth, built from vitkit's encoder :class:`Block`) embeds the
  encoded tokens, puts a learnable mask token at every hidden position, adds its own position
  embeddings (learned here; MAE fixes them to 2-D sin-cos) and predicts every patch's pixels.
- The loss is the mean squared error on the hidden patches only, against the patch pixels of
  the model input, standardised per patch with ``norm_pix_loss`` (MAE's best setting).

Only the encoder is kept for fine-tuning; the decoder is the objective's.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

from vitkit.errors import VitkitError
from vitkit.models.vit import Block, VisionTransformer
from vitkit.registry.model_config import ViTConfig
from vitkit.selfsup.objective_config import MAEConfig
from vitkit.selfsup.patches import normalize_patches, patchify, unpatchify


def random_masking(
    batch: int, num_patches: int, mask_ratio: float, generator: torch.Generator
) -> tuple[Tensor, Tensor]:
    """(visible patch indices ``[B, K]`` in ascending order, hidden mask ``[B, N]`` bool):
    ``K = N - round(mask_ratio * N)`` patches of every image stay visible."""
    n_hidden = int(round(mask_ratio * num_patches))
    keep = num_patches - n_hidden
    if keep < 1 or n_hidden < 1:
        raise VitkitError(
            f"mask_ratio {mask_ratio:g} of {num_patches} patches hides {n_hidden}; at least "
            "one patch must be hidden and one visible"
        )
    scores = torch.rand(batch, num_patches, generator=generator, device=generator.device)
    visible = scores.argsort(dim=1)[:, :keep].sort(dim=1).values
    hidden = torch.ones(batch, num_patches, dtype=torch.bool, device=generator.device)
    hidden.scatter_(1, visible, False)
    return visible, hidden


def encode_visible(encoder: VisionTransformer, x: Tensor, visible: Tensor) -> Tensor:
    """The encoder on the visible patches only: ``[B, prefix + K, D]`` final-normalised tokens."""
    p = encoder.cfg.num_pos_prefix  # E_pos rows of the class token and registers (or none)
    if encoder.pos_embed is None or encoder.rope is not None:
        raise VitkitError("MAE here needs the learned E_pos and no rotary embeddings (rope)")
    patches = encoder.patch_embed(x) + encoder.pos_embed[:, p:]
    d = patches.shape[-1]
    tokens = patches.gather(1, visible.to(x.device).unsqueeze(-1).expand(-1, -1, d))
    prefix: list[Tensor] = [
        t for t in (encoder.cls_token, encoder.dist_token, encoder.reg_token) if t is not None
    ]
    if prefix:
        pre = torch.cat(prefix, dim=1)
        pre = pre + encoder.pos_embed[:, :p] if p else pre
        tokens = torch.cat([pre.expand(len(x), -1, -1), tokens], dim=1)
    return encoder.encode(encoder.norm_pre(encoder.pos_drop(tokens)))


class MAEDecoder(nn.Module):
    """Encoded visible tokens → predicted pixels of every patch ``[B, N, C ph pw]``."""

    def __init__(self, cfg: MAEConfig, encoder_cfg: ViTConfig) -> None:
        super().__init__()
        w = cfg.decoder_width
        block_cfg = encoder_cfg.replace(
            width=w,
            depth=cfg.decoder_depth,
            num_heads=cfg.decoder_heads,
            mlp_dim=cfg.decoder_mlp_dim or 4 * w,
            dropout=0.0,
            attn_dropout=0.0,
            drop_path=0.0,
        )
        self.prefix = encoder_cfg.num_prefix_tokens
        self.embed = nn.Linear(encoder_cfg.width, w)
        self.mask_token = nn.Parameter(torch.zeros(1, 1, w))
        self.pos_embed = nn.Parameter(torch.zeros(1, encoder_cfg.seq_len, w))
        self.blocks = nn.ModuleList(Block(block_cfg) for _ in range(cfg.decoder_depth))
        self.norm = nn.LayerNorm(w, eps=encoder_cfg.layer_norm_eps)
        ph, pw = encoder_cfg.patch_size
        self.pred = nn.Linear(w, encoder_cfg.in_chans * ph * pw)
        self._init()

    @torch.no_grad()
    def _init(self) -> None:
        nn.init.normal_(self.mask_token, std=0.02)
        nn.init.normal_(self.pos_embed, std=0.02)
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.xavier_uniform_(m.weight)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
            elif isinstance(m, nn.LayerNorm):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)

    def forward(self, encoded: Tensor, visible: Tensor, num_patches: int) -> Tensor:
        y = self.embed(encoded)  # [B, prefix + K, W]
        b, _, w = y.shape
        index = visible.to(y.device).unsqueeze(-1).expand(-1, -1, w)
        full = (
            self.mask_token.to(y.dtype)
            .expand(b, num_patches, w)
            .scatter(1, index, y[:, self.prefix :])
        )
        z = torch.cat([y[:, : self.prefix], full], dim=1) + self.pos_embed
        for block in self.blocks:
            z = block(z)
        return self.pred(self.norm(z)[:, self.prefix :])


class MaskedAutoencoder(nn.Module):
    """The MAE objective's weights (the decoder) and its loss; the encoder is passed in."""

    def __init__(self, cfg: MAEConfig, encoder_cfg: ViTConfig) -> None:
        super().__init__()
        if encoder_cfg.is_hybrid:
            raise VitkitError("MAE needs a plain ViT: a ResNet stem would see the hidden patches")
        if encoder_cfg.rel_pos != "none" or not encoder_cfg.abs_pos_embed:
            raise VitkitError("MAE needs absolute position embeddings and no relative bias")
        self.cfg = cfg
        self.patch_size = encoder_cfg.patch_size
        self.decoder = MAEDecoder(cfg, encoder_cfg)

    is_classification = False

    def targets(self, x: Tensor) -> Tensor:
        patches = patchify(x.float(), self.patch_size)
        return normalize_patches(patches) if self.cfg.norm_pix_loss else patches

    def loss(self, pred: Tensor, targets: Tensor, hidden: Tensor) -> Tensor:
        """Mean squared error per patch, averaged over the hidden patches only."""
        per_patch = (pred.float() - targets.to(pred.device)).pow(2).mean(-1)  # [B, N]
        where = hidden.to(pred.device).float()
        return (per_patch * where).sum() / where.sum()

    def reconstruct(
        self, encoder: VisionTransformer, x: Tensor, generator: torch.Generator
    ) -> tuple[Tensor, Tensor]:
        """(predicted patches ``[B, N, C ph pw]``, hidden mask ``[B, N]``)."""
        n = encoder.cfg.num_patches
        visible, hidden = random_masking(len(x), n, self.cfg.mask_ratio, generator)
        return self.decoder(encode_visible(encoder, x, visible), visible, n), hidden

    def forward(
        self, encoder: VisionTransformer, x: Tensor, pixels: Tensor, generator: torch.Generator
    ) -> tuple[Tensor, Tensor, int]:
        """(loss, 0 (no accuracy), hidden patches counted) for model inputs ``x``."""
        pred, hidden = self.reconstruct(encoder, x, generator)
        loss = self.loss(pred, self.targets(x), hidden)
        return loss, torch.zeros((), dtype=torch.long), int(hidden.sum())

    @torch.no_grad()
    def preview(
        self,
        encoder: VisionTransformer,
        x: Tensor,
        to_pixels: Callable[[Tensor], Tensor],
        generator: torch.Generator,
    ) -> list[tuple[str, Tensor]]:
        """Rows of images in [0, 1]: the input, the visible patches (hidden ones grey), the
        reconstruction, and the reconstruction with the visible patches pasted in."""
        pred, hidden = self.reconstruct(encoder, x, generator)
        pred = pred.float()
        target = patchify(x.float(), self.patch_size)
        if self.cfg.norm_pix_loss:  # back to the image's scale with each patch's own statistics
            mean = target.mean(-1, keepdim=True)
            std = (target.var(-1, keepdim=True) + 1e-6) ** 0.5
            pred = pred * std + mean
        grid = encoder.cfg.grid_size
        hide = hidden.to(x.device).unsqueeze(-1)
        visible = torch.where(hide, torch.zeros_like(target), target)
        pixels = to_pixels(x)
        grey = patchify(torch.full_like(pixels, 0.5), self.patch_size)
        seen = torch.where(hide, grey, patchify(pixels, self.patch_size))
        recon = to_pixels(unpatchify(pred, self.patch_size, grid))
        pasted = to_pixels(unpatchify(torch.where(hide, pred, visible), self.patch_size, grid))
        return [
            ("input", pixels),
            ("visible", unpatchify(seen, self.patch_size, grid)),
            ("reconstruction", recon),
            ("+ visible", pasted),
        ]
