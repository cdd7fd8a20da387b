"""NaFlex: one ViT for images of any aspect ratio at their native resolution (timm's NaFlexVit).

NaFlex (NaViT's native-resolution packing + FlexiViT's resampled embeddings, as timm 1.0.31's
``naflexvit.py`` and SigLIP 2 do it) changes the ViT in three places, all of them here; the
blocks are the paper's (``ViTConfig.naflex`` and the ``naflex_*`` fields switch it on):

- **Position embeddings on their own grid.** E_pos is a learned table on ``naflex_grid`` (timm's
  ``pos_embed_grid_size``; patches only, prefix tokens get none), resampled to each image's
  patch grid (h, w) with ``F.interpolate(mode=naflex_interp, antialias=naflex_antialias,
  align_corners=naflex_align_corners)``; aspect-preserving (``naflex_ar_preserving``) resamples
  to a max(h, w) square and keeps its top-left h x w. ``naflex_pos="factorized"`` holds a row
  table and a column table (stored here as one [1, rows + columns, D] parameter, rows first),
  each resampled linearly, summed. As timm, a resampled table is computed in float32 and cast
  back; the table itself is used as it is where the grid is its own (``naflex_resample_own``:
  resampled there too, as transformers' SigLIP 2 does on the CPU).
- **Packed patches.** :func:`pack` turns images of different sizes into timm's NaFlex batch:
  ``patches`` [B, N, P*P*C] (each patch flattened row, column, channel; an image's patches
  row-major, then zero padding up to ``max_seq_len``), ``patch_coord`` [B, N, 2] (row,
  column) and ``patch_valid`` [B, N]. The patch embedding is the model's E as a linear map.
- **Masks.** Self-attention gets timm's additive mask (a pair is allowed when query and key are
  both valid; prefix tokens always are), the MAP probe a key mask, GAP / max a masked mean /
  max over the valid patches.

Exactly as timm adds E_pos in NaFlex mode: image b's grid is ``coord[b].max(0) + 1`` and its
resampled table is added to its first min(N, h w) tokens in row-major order (the coordinates
are not read otherwise), so a batch from :func:`pack` (or timm's loader) is what it expects.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from vitkit.errors import VitkitError
from vitkit.models.map_head import require_map_head
from vitkit.models.posemb_resample import antialiased, symbolic
from vitkit.pil_images import fit_size as fit_size  # (the size an image is resized to)
from vitkit.registry.model_config import ViTConfig


def pos_rows(cfg: ViTConfig) -> int:
    """Rows of the E_pos parameter [1, rows, D] of a NaFlex model."""
    h, w = cfg.naflex_grid
    return h + w if cfg.naflex_pos == "factorized" else h * w


def pos_embed_for_grid(table: Tensor, cfg: ViTConfig, grid: tuple[int, int]) -> Tensor:
    """E_pos [1, h * w, D] for one image's patch grid (h, w), row-major (timm's NaFlexEmbeds)."""
    gh, gw = cfg.naflex_grid
    h, w = grid
    traced = symbolic(grid)  # (an export of any size: resampled, the identity at its own grid)
    side = torch.sym_max(h, w) if traced else max(h, w)
    if cfg.naflex_pos == "factorized":
        side_y, side_x = (side, side) if cfg.naflex_ar_preserving else (h, w)
        pe_y = _interp1d(table[:, :gh], side_y, traced)[:, :h]
        pe_x = _interp1d(table[:, gh:], side_x, traced)[:, :w]
        return (pe_y.unsqueeze(2) + pe_x.unsqueeze(1)).flatten(1, 2)
    if not traced and (h, w) == (gh, gw) and not cfg.naflex_resample_own:
        return table
    size = (side, side) if cfg.naflex_ar_preserving else (h, w)
    grid_table = table.reshape(1, gh, gw, -1).permute(0, 3, 1, 2).float()
    if traced and cfg.naflex_antialias and not cfg.naflex_align_corners:  # (no Resize: exact)
        out = antialiased(grid_table, list(size), cfg.naflex_interp)[:, :, :h, :w]
        return out.flatten(2).transpose(1, 2).to(table.dtype)
    out = F.interpolate(
        grid_table,
        size=size,
        mode=cfg.naflex_interp,
        align_corners=cfg.naflex_align_corners,
        antialias=cfg.naflex_antialias,
    )[:, :, :h, :w]
    return out.flatten(2).transpose(1, 2).to(table.dtype)


def _interp1d(table: Tensor, length: int, traced: bool = False) -> Tensor:
    if not traced and table.shape[1] == length:
        return table
    out = F.interpolate(table.permute(0, 2, 1).float(), size=length, mode="linear")
    return out.permute(0, 2, 1).to(table.dtype)


def patchify(image: Tensor, patch: tuple[int, int]) -> tuple[Tensor, tuple[int, int]]:
    """One image [C, H, W] (H, W multiples of the patch) -> its patches [h w, ph pw C],
    row-major, each flattened (row, column, channel) as timm's ``batch_patchify``; and (h, w)."""
    c, height, width = image.shape
    ph, pw = patch
    if height % ph or width % pw:
        raise VitkitError(f"an image of {height}x{width} is not tiled by {ph}x{pw} patches")
    h, w = height // ph, width // pw
    x = image.reshape(c, h, ph, w, pw).permute(1, 3, 2, 4, 0)
    return x.reshape(h * w, ph * pw * c), (h, w)


def pack(
    images: list[Tensor], patch: tuple[int, int], max_seq_len: int | None = None
) -> dict[str, Tensor]:
    """Images [C, H, W] of any sizes (multiples of the patch) -> timm's NaFlex batch dict
    (``patches``, ``patch_coord``, ``patch_valid``), padded to ``max_seq_len`` (default: the
    longest image's patch count). An image with more patches than that is refused."""
    parts = [patchify(img, patch) for img in images]
    longest = max(p.shape[0] for p, _ in parts)
    n = longest if max_seq_len is None else max_seq_len
    if longest > n:
        raise VitkitError(f"an image has {longest} patches, more than max_seq_len {n}")
    dtype = images[0].dtype
    patches = torch.zeros(len(images), n, parts[0][0].shape[1], dtype=dtype)
    coord = torch.zeros(len(images), n, 2, dtype=torch.int64)
    valid = torch.zeros(len(images), n, dtype=torch.bool)
    for b, (p, (h, w)) in enumerate(parts):
        ys, xs = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
        patches[b, : h * w] = p
        coord[b, : h * w] = torch.stack([ys.flatten(), xs.flatten()], dim=1)
        valid[b, : h * w] = True
    return {"patches": patches, "patch_coord": coord, "patch_valid": valid}


def unpack(batch: dict[str, Tensor], patch: tuple[int, int], channels: int) -> list[Tensor]:
    """The images [C, H, W] of a packed batch, each at its own size: :func:`pack` undone (an
    exported model of any size runs them so, the padding and its masks not needed)."""
    ph, pw = patch
    images = []
    for p, coord, valid in zip(batch["patches"], batch["patch_coord"], batch["patch_valid"]):
        n = int(valid.sum())
        h, w = (int(v) + 1 for v in coord[:n].amax(dim=0))
        if h * w != n:
            raise VitkitError(f"a packed image of {n} patches is not a {h}x{w} grid")
        x = p[:n].reshape(h, w, ph, pw, channels).permute(4, 0, 2, 1, 3)
        images.append(x.reshape(channels, h * ph, w * pw))
    return images


def attention_mask(valid: Tensor, num_prefix: int, dtype: torch.dtype) -> Tensor:
    """timm's ``create_attention_mask``: [B, 1, T, T], 0 where query and key are both valid,
    the dtype's most negative value elsewhere (prefix tokens are always valid)."""
    prefix = valid.new_ones(valid.shape[0], num_prefix)
    ok = torch.cat([prefix, valid.bool()], dim=1)
    mask = torch.zeros(ok.shape[0], 1, ok.shape[1], ok.shape[1], dtype=dtype, device=valid.device)
    return mask.masked_fill_(~(ok[:, None, :, None] & ok[:, None, None, :]), torch.finfo(dtype).min)


def embed(model: Any, patches: Tensor, coord: Tensor) -> Tensor:
    """Eq. 1 for a NaFlex batch: E as a linear map of the flattened patches, the patch norm,
    each image's resampled E_pos, the prefix tokens, dropout and ``norm_pre``."""
    cfg: ViTConfig = model.cfg
    proj = model.patch_embed.proj
    expected = cfg.patch_size[0] * cfg.patch_size[1] * cfg.in_chans
    if patches.ndim != 3 or patches.shape[-1] != expected:
        raise VitkitError(f"expected patches [B, N, {expected}], got {tuple(patches.shape)}")
    weight = proj.weight.permute(0, 2, 3, 1).reshape(proj.weight.shape[0], -1)
    x = model.patch_embed.norm(F.linear(patches, weight, proj.bias))
    grids = (coord.amax(dim=1) + 1).tolist()
    pos = torch.zeros_like(x)
    for b, grid in enumerate(grids):
        table = pos_embed_for_grid(model.pos_embed, cfg, (int(grid[0]), int(grid[1])))
        n = min(x.shape[1], table.shape[1])
        pos[b, :n] = table[0, :n].to(x.dtype)
    x = x + pos
    prefix = [
        t.expand(x.shape[0], -1, -1) for t in (model.cls_token, model.reg_token) if t is not None
    ]
    return model.norm_pre(model.pos_drop(torch.cat([*prefix, x], dim=1)))


def forward(model: Any, batch: dict[str, Tensor], pre_logits: bool = False) -> Tensor:
    """Logits [B, classes] of a NaFlex batch (``patches``, ``patch_coord``, ``patch_valid``;
    timm's NaFlexVit.forward on the same dict); ``pre_logits``: the features before the head."""
    missing = [k for k in ("patches", "patch_coord", "patch_valid") if k not in batch]
    if missing:
        raise VitkitError(f"a NaFlex batch needs {', '.join(missing)}")
    if not model.cfg.naflex:
        raise VitkitError("packed patches need a NaFlex model (ViTConfig.naflex)")
    valid = batch["patch_valid"].bool()
    x = embed(model, batch["patches"], batch["patch_coord"])
    prefix = model.cfg.num_prefix_tokens
    mask = attention_mask(valid, prefix, x.dtype)
    for block in model.blocks:
        x = block(x, bias=mask)  # (the padding mask: an additive bias on the logits)
    return model._classify(pool(model, model.norm(x), valid), x, pre_logits)


def pool(model: Any, tokens: Tensor, valid: Tensor) -> Tensor:
    """The config's pooling over the valid patch tokens only (timm's ``global_pool_naflex``)."""
    cfg: ViTConfig = model.cfg
    if cfg.pool == "none":  # (a pruned head: every token, the padding's included, as timm's)
        return model.fc_norm(tokens)
    if cfg.pool == "token":
        return model.fc_norm(tokens[:, 0])
    patches = tokens[:, cfg.num_prefix_tokens :]
    require_map_head(cfg, model.attn_pool)
    if model.attn_pool is not None:
        key_mask = torch.zeros(valid.shape, dtype=tokens.dtype, device=tokens.device)
        key_mask.masked_fill_(~valid, torch.finfo(tokens.dtype).min)
        return model.fc_norm(model.attn_pool(patches, key_mask[:, None, None, :]))
    keep = valid.to(tokens.dtype)
    mean = (patches * keep.unsqueeze(-1)).sum(dim=1) / keep.sum(dim=1, keepdim=True).clamp(min=1)
    if cfg.pool == "gap":
        return model.fc_norm(mean)
    top = patches.masked_fill(~valid.unsqueeze(-1), torch.finfo(tokens.dtype).min).amax(dim=1)
    return model.fc_norm(top if cfg.pool == "max" else 0.5 * (mean + top))
