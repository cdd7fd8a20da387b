"""What the attention looks at: per-layer maps, attention rollout, mean attention distance.

- **Attention maps.** Every block's softmax weights [B, heads, T, T] come from
  :meth:`VisionTransformer.forward_with_attentions` (the explicit-softmax path).
  :func:`patch_map` reads, from a [.., T, T] matrix, what the model's output looks at over the
  patch grid (:func:`pooled_row`): the class token's row for ``pool="token"`` (DeiT: the mean
  of the class and distillation tokens' rows, whose heads are averaged), the mean row over the
  patch tokens for ``pool="gap"`` (the pooled feature is their mean; ``"avgmax"`` / ``"max"``
  are shown the same way), and for ``pool="map"`` the patch rows weighted by the MAP probe's
  attention (heads averaged); then the patch columns, renormalised. Prefix tokens (class,
  distillation, registers) are never in the grid: :func:`prefix_attention_share` and
  :func:`prefix_rollout_share` report the attention they take.
- **Attention rollout** (Abnar & Zuidema, 2020; the paper's Figure 6 and Appendix D.8):
  average the heads, add the identity for the residual connection, renormalise the rows, and
  multiply the matrices from the first layer to the last, ``R = Â_L ... Â_1``. Each row of R is
  a distribution over input tokens; with attention that is the identity, R is the identity.
- **Mean attention distance** (Figure 7, right; Appendix D.7): for a query patch, the pixel
  distance to every key patch weighted by the attention, averaged over query patches and
  images, per head and layer. Distances are between patch centres in input pixels (non-square
  patches and grids included). The class token is neither a query nor a key here, and the
  weights of a query over the patches are renormalised: a head that puts most of its weight on
  the class token is measured by where its remaining weight goes, instead of reading as
  "local" (the paper does not say how it treats the class token).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Literal

import torch
from torch import Tensor

from vitkit.errors import VitkitError
from vitkit.models.vit import VisionTransformer
from vitkit.registry.model_config import ViTConfig

HeadFusion = Literal["mean", "max", "min"]
ATTENTION_BYTES = 1 << 30  # analysis batches hold at most about this much attention (float32)


def safe_batch_size(cfg: ViTConfig, batch_size: int) -> int:
    """``batch_size``, lowered so one batch's attention maps (every layer's [heads, T, T] per
    image, as ``forward_with_attentions`` returns them) stay under ``ATTENTION_BYTES``: 32 images
    of B/16 at 224 px fit, an L/16 at 384 px goes a few images at a time."""
    per_image = cfg.depth * cfg.num_heads * cfg.seq_len**2 * 4
    return max(1, min(batch_size, ATTENTION_BYTES // per_image))


def input_config(model: VisionTransformer, x: Tensor) -> ViTConfig:
    """The model's config at the size of images ``x`` [B, C, H, W]: a model runs at any
    multiple of its patch size, and the grid, token count and patch pixels follow the input."""
    size = (x.shape[-2], x.shape[-1])
    model.patch_embed.grid_for(size)  # a size the patches do not tile: the model's one line
    return model.cfg if size == model.cfg.image_size else model.cfg.replace(image_size=size)


@contextmanager
def eval_mode(model: torch.nn.Module) -> Iterator[None]:
    """Run ``model`` in eval mode (no dropout), then restore its previous mode."""
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)


def attention_weights(model: VisionTransformer, x: Tensor) -> tuple[list[Tensor], Tensor]:
    """Every block's attention weights [B, heads, T, T] (float32, on CPU) and the logits
    [B, classes], for normalised model input ``x`` [B, C, H, W], in eval mode."""
    attentions, logits, _ = attention_outputs(model, x)
    return attentions, logits


def attention_outputs(
    model: VisionTransformer, x: Tensor
) -> tuple[list[Tensor], Tensor, Tensor | None]:
    """:func:`attention_weights` and, for a ``pool="map"`` model, the MAP probe's attention
    over the patch tokens [B, heads, N] (else None)."""
    device = next(model.parameters()).device
    with eval_mode(model), torch.inference_mode():
        out = model.forward_with_attentions(x.to(device))
    pool = None if out.pool_attention is None else out.pool_attention.float().cpu()
    return [a.float().cpu() for a in out.attentions], out.logits.float().cpu(), pool


def _check_attentions(attentions: Sequence[Tensor]) -> None:
    if not attentions:
        raise VitkitError("no attention maps given (a model has at least one block)")
    for i, a in enumerate(attentions):
        if a.ndim != 4 or a.shape[-1] != a.shape[-2] or a.shape != attentions[0].shape:
            raise VitkitError(
                f"attention map {i} has shape {tuple(a.shape)}; expected every layer's "
                f"[B, heads, T, T] with the shape of layer 0, {tuple(attentions[0].shape)}"
            )


def fuse_heads(attention: Tensor, how: HeadFusion = "mean") -> Tensor:
    """[B, heads, T, T] → [B, T, T]: the heads' mean (the paper's rollout), max or min."""
    if how == "mean":
        return attention.mean(dim=1)
    if how == "max":
        return attention.amax(dim=1)
    if how == "min":
        return attention.amin(dim=1)
    raise VitkitError(f"head fusion must be mean, max or min, got {how!r}")


def rollout_by_layer(
    attentions: Sequence[Tensor], *, head_fusion: HeadFusion = "mean", residual: bool = True
) -> list[Tensor]:
    """Attention rollout after each layer: ``[Â_1, Â_2 Â_1, ..., Â_L ... Â_1]``, each
    [B, T, T] with rows that are distributions over the input tokens.

    ``Â_l = normalise_rows(fuse_heads(A_l) + I)``; ``residual=False`` leaves out the identity
    (then rows are renormalised fused attention, which for ``"mean"`` is the attention itself).
    """
    _check_attentions(attentions)
    b, _, t, _ = attentions[0].shape
    eye = torch.eye(t, dtype=torch.float64)
    rolled = eye.expand(b, t, t)
    out = []
    for a in attentions:
        a_hat = fuse_heads(a.to(torch.float64), head_fusion)
        if residual:
            a_hat = a_hat + eye
        a_hat = a_hat / a_hat.sum(dim=-1, keepdim=True)
        rolled = a_hat @ rolled  # the later layer on the left: R_l = Â_l R_{l-1}
        out.append(rolled.float())
    return out


def attention_rollout(
    attentions: Sequence[Tensor], *, head_fusion: HeadFusion = "mean", residual: bool = True
) -> Tensor:
    """Attention rollout through all layers, ``Â_L ... Â_1`` [B, T, T] (see
    :func:`rollout_by_layer`)."""
    return rollout_by_layer(attentions, head_fusion=head_fusion, residual=residual)[-1]


def pooled_row(matrix: Tensor, cfg: ViTConfig, pool_attention: Tensor | None = None) -> Tensor:
    """The row of ``matrix`` [..., T, T] (attention or rollout, rows = queries) that the
    model's output reads, [..., T]: the class token's (DeiT: the mean of the class and
    distillation tokens'), the mean over the patch tokens' (GAP, avgmax, max), or for
    ``pool="map"`` the patch rows weighted by the MAP probe's attention ``pool_attention``
    [B, heads, N] with the heads averaged (the mean over the patch rows when not given)."""
    t, p = cfg.seq_len, cfg.num_prefix_tokens
    if matrix.shape[-2:] != (t, t):
        raise VitkitError(
            f"a {cfg.short_name} model at {cfg.image_size} px has {t} tokens, but the matrix "
            f"is {tuple(matrix.shape[-2:])}"
        )
    if cfg.pool == "token":
        return matrix[..., :2, :].mean(dim=-2) if cfg.dist_token else matrix[..., 0, :]
    if cfg.pool != "map" or pool_attention is None:
        return matrix[..., p:, :].mean(dim=-2)
    n = cfg.seq_len if cfg.map_prefix else cfg.num_patches  # (map_prefix: every token's row)
    if pool_attention.ndim != 3 or pool_attention.shape[-1] != n:
        raise VitkitError(
            f"the MAP attention is {tuple(pool_attention.shape)}; expected [B, heads, {n}]"
        )
    w = pool_attention.to(matrix.dtype).mean(dim=1)  # [B, N]
    w = w.reshape(w.shape[0], *([1] * (matrix.ndim - 3)), n, 1)
    return (w * matrix[..., t - n :, :]).sum(dim=-2)


def patch_map(matrix: Tensor, cfg: ViTConfig, pool_attention: Tensor | None = None) -> Tensor:
    """What the model's output attends to, as a distribution over the patch grid.

    ``matrix`` is [..., T, T] (attention or rollout, rows = queries); its :func:`pooled_row`,
    restricted to the patch columns and renormalised to sum to 1. Returns
    [..., grid_h, grid_w].
    """
    patches = pooled_row(matrix, cfg, pool_attention)[..., cfg.num_prefix_tokens :]
    patches = patches / patches.sum(dim=-1, keepdim=True).clamp_min(1e-12)
    return patches.reshape(*patches.shape[:-1], *cfg.grid_size)


def prefix_groups(cfg: ViTConfig) -> dict[str, slice]:
    """The token positions of each group of prefix tokens, in the model's order (class token,
    distillation token, registers); empty for a model without any."""
    groups, start = {}, 0
    for name, n in (
        ("class token", int(cfg.has_class_token)),
        ("distillation token", int(cfg.dist_token)),
        ("registers", cfg.num_reg_tokens),
    ):
        if n:
            groups[name] = slice(start, start + n)
        start += n
    return groups


def prefix_attention_share(attentions: Sequence[Tensor], cfg: ViTConfig) -> dict[str, Tensor]:
    """For each group of prefix tokens, the share of the patch tokens' attention it takes,
    [B, L]: the attention weight of every patch query on the group's keys, summed over the
    group and averaged over heads and patch queries. ``"patches"`` is the rest, so the groups
    sum to 1 per image and layer."""
    p = cfg.num_prefix_tokens
    out: dict[str, list[Tensor]] = {name: [] for name in (*prefix_groups(cfg), "patches")}
    for i, a in enumerate(attentions):
        if a.ndim != 4 or a.shape[-1] != cfg.seq_len or a.shape[-2] != cfg.seq_len:
            raise VitkitError(
                f"attention map {i} has shape {tuple(a.shape)}; a model with {cfg.seq_len} "
                f"tokens gives [B, heads, {cfg.seq_len}, {cfg.seq_len}]"
            )
        queries = a[:, :, p:, :].to(torch.float64)  # [B, heads, N, T], the patch queries
        for name, cols in prefix_groups(cfg).items():
            out[name].append(queries[..., cols].sum(-1).mean(dim=(1, 2)))
        out["patches"].append(queries[..., p:].sum(-1).mean(dim=(1, 2)))
    return {k: torch.stack(v, dim=1).float() for k, v in out.items()}


def prefix_rollout_share(
    rollout: Tensor, cfg: ViTConfig, pool_attention: Tensor | None = None
) -> dict[str, Tensor]:
    """For each group of prefix tokens, the share of the pooled output's rollout row
    (:func:`pooled_row`) that ends on it, [B]; ``"patches"`` is the rest (the part that
    :func:`vitkit.analysis.attention.patch_map` renormalises into the map)."""
    row = pooled_row(rollout.to(torch.float64), cfg, pool_attention)  # [B, T]
    row = row / row.sum(dim=-1, keepdim=True).clamp_min(1e-12)
    out = {name: row[:, cols].sum(-1).float() for name, cols in prefix_groups(cfg).items()}
    out["patches"] = row[:, cfg.num_prefix_tokens :].sum(-1).float()
    return out


def token_pixels(cfg: ViTConfig) -> tuple[int, int]:
    """The (height, width) in input pixels that one patch token covers: the patch size, times
    the ResNet's downsampling for a hybrid."""
    s = cfg.stem_stride
    return cfg.patch_size[0] * s, cfg.patch_size[1] * s


def box_mass(maps: Tensor, boxes: Tensor, cfg: ViTConfig) -> tuple[Tensor, Tensor]:
    """The share of each map's mass that lies inside an object box, and the box's share of the
    image.

    ``maps`` [B, gh, gw] are distributions over patches (:func:`patch_map`); a patch's mass is
    spread evenly over its pixels, so a box covering a third of a patch gets a third of its mass
    (exact rectangle overlap). ``boxes`` [B, 4] are (x0, y0, x1, y1) in model-input pixels.
    Returns ``(mass_inside [B], area_share [B])``; their ratio is 1 for a map that ignores the
    object and grows the more the map concentrates on it.
    """
    (gh, gw), (ph, pw) = cfg.grid_size, token_pixels(cfg)
    h, w = cfg.image_size
    if maps.ndim != 3 or tuple(maps.shape[1:]) != (gh, gw):
        raise VitkitError(f"expected maps [B, {gh}, {gw}], got {tuple(maps.shape)}")
    if boxes.shape != (maps.shape[0], 4):
        raise VitkitError(f"expected boxes [{maps.shape[0]}, 4], got {tuple(boxes.shape)}")
    boxes = boxes.to(torch.float64)
    x0, y0 = boxes[:, 0].clamp(0, w), boxes[:, 1].clamp(0, h)
    x1, y1 = boxes[:, 2].clamp(0, w), boxes[:, 3].clamp(0, h)
    px = torch.arange(gw, dtype=torch.float64) * pw  # patch left edges
    py = torch.arange(gh, dtype=torch.float64) * ph
    ox = (torch.minimum(x1[:, None], px + pw) - torch.maximum(x0[:, None], px)).clamp_min(0)
    oy = (torch.minimum(y1[:, None], py + ph) - torch.maximum(y0[:, None], py)).clamp_min(0)
    overlap = oy[:, :, None] * ox[:, None, :] / (ph * pw)  # [B, gh, gw] fraction of each patch
    inside = (maps.to(torch.float64) * overlap).sum(dim=(1, 2))
    share = (x1 - x0) * (y1 - y0) / (h * w)
    return inside.float(), share.float()


def patch_distances(cfg: ViTConfig) -> Tensor:
    """Pixel distance between the centres of every pair of patches, [N, N] (row-major)."""
    (gh, gw), (ph, pw) = cfg.grid_size, token_pixels(cfg)
    ys = (torch.arange(gh, dtype=torch.float64) + 0.5) * ph
    xs = (torch.arange(gw, dtype=torch.float64) + 0.5) * pw
    centres = torch.stack(torch.meshgrid(ys, xs, indexing="ij"), dim=-1).reshape(-1, 2)
    return torch.cdist(centres, centres)


def attention_distance(attentions: Sequence[Tensor], cfg: ViTConfig) -> Tensor:
    """Mean attention distance in pixels per image, layer and head, [B, L, heads]: for each
    query patch the attention-weighted distance to the key patches (weights renormalised over
    patches), averaged over query patches."""
    _check_attentions(attentions)
    p = cfg.num_prefix_tokens
    dist = patch_distances(cfg)
    out = []
    for a in attentions:
        if a.shape[-1] != cfg.seq_len:
            raise VitkitError(
                f"attention over {a.shape[-1]} tokens does not fit a model with {cfg.seq_len}"
            )
        w = a[..., p:, p:].to(torch.float64)  # [B, heads, N, N], patch queries and keys
        w = w / w.sum(dim=-1, keepdim=True).clamp_min(1e-12)
        out.append((w * dist).sum(dim=-1).mean(dim=-1))  # [B, heads]
    return torch.stack(out, dim=1).float()


def mean_attention_distance(
    model: VisionTransformer, images: Tensor, *, batch_size: int = 32
) -> Tensor:
    """:func:`attention_distance` averaged over ``images`` (normalised model input), [L, heads].

    Runs in batches, so memory stays at one batch's attention maps.
    """
    if images.shape[0] == 0:
        raise VitkitError("mean attention distance needs at least one image")
    cfg = input_config(model, images)
    batch_size = safe_batch_size(cfg, batch_size)
    total = None
    for start in range(0, images.shape[0], batch_size):
        attentions, _ = attention_weights(model, images[start : start + batch_size])
        d = attention_distance(attentions, cfg).sum(dim=0).double()
        total = d if total is None else total + d
    assert total is not None
    return (total / images.shape[0]).float()


@dataclass
class Explanation:
    """What :func:`explain` finds for a batch of images.

    Attributes:
        logits: [B, classes].
        layer_maps: [B, L, heads, gh, gw], each head's attention from the pooled query over
            patches (:func:`pooled_row`; for a MAP model the patch rows weighted by the probe's
            attention).
        rollout_maps: [B, L, gh, gw], the rollout through layers 1..l over patches, read the
            same way.
        pool_maps: [B, heads, gh, gw], the MAP probe's attention over the patches
            (``pool="map"``; else None): what the pooled features are a weighted mean of.
        prefix_attention: per group of prefix tokens (class token, distillation token,
            registers) and ``"patches"``, the share of the patch queries' attention on it, [B, L]
            (:func:`prefix_attention_share`). Empty but ``"patches"`` without prefix tokens.
        prefix_rollout: the same for the pooled output's full rollout, [B]
            (:func:`prefix_rollout_share`).
    """

    logits: Tensor
    layer_maps: Tensor
    rollout_maps: Tensor
    pool_maps: Tensor | None = None
    prefix_attention: dict[str, Tensor] = field(default_factory=dict)
    prefix_rollout: dict[str, Tensor] = field(default_factory=dict)

    @property
    def rollout(self) -> Tensor:
        """The rollout through all layers over the patches, [B, gh, gw]."""
        return self.rollout_maps[:, -1]


def require_attention(model: object) -> VisionTransformer:
    """``model`` if it is a Vision Transformer; a clear error for one without attention (a BiT
    ResNet)."""
    if not isinstance(model, VisionTransformer):
        name = getattr(getattr(model, "cfg", None), "short_name", type(model).__name__)
        raise VitkitError(f"{name} is not a Vision Transformer: it has no attention to analyse")
    return model


def explain(
    model: VisionTransformer,
    x: Tensor,
    *,
    head_fusion: HeadFusion = "mean",
    batch_size: int = 32,
) -> Explanation:
    """Per-layer, per-head attention maps and the attention rollout of images ``x``
    (normalised model input [B, C, H, W], any multiple of the patch size), all over the patch
    grid of their size."""
    cfg = input_config(require_attention(model), x)
    batch_size = safe_batch_size(cfg, batch_size)
    logits, layer_maps, rollout_maps, pool_maps = [], [], [], []
    shares: dict[str, list[Tensor]] = {}
    rolled_shares: dict[str, list[Tensor]] = {}
    for start in range(0, x.shape[0], batch_size):
        attentions, out, pool = attention_outputs(model, x[start : start + batch_size])
        logits.append(out)
        layer_maps.append(torch.stack([patch_map(a, cfg, pool) for a in attentions], dim=1))
        rolled = rollout_by_layer(attentions, head_fusion=head_fusion)
        rollout_maps.append(torch.stack([patch_map(r, cfg, pool) for r in rolled], dim=1))
        if pool is not None:
            pool_maps.append(pool.reshape(*pool.shape[:2], *cfg.grid_size))
        for k, v in prefix_attention_share(attentions, cfg).items():
            shares.setdefault(k, []).append(v)
        for k, v in prefix_rollout_share(rolled[-1], cfg, pool).items():
            rolled_shares.setdefault(k, []).append(v)
    return Explanation(
        torch.cat(logits),
        torch.cat(layer_maps),
        torch.cat(rollout_maps),
        torch.cat(pool_maps) if pool_maps else None,
        {k: torch.cat(v) for k, v in shares.items()},
        {k: torch.cat(v) for k, v in rolled_shares.items()},
    )
