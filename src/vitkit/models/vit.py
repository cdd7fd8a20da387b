"""The Vision Transformer of Dosovitskiy et al., "An Image is Worth 16x16 Words" (ICLR 2021).

The model is Eq. 1-4 of the paper, top to bottom:

    z_0  = [x_class; x_p^1 E; ...; x_p^N E] + E_pos       (1)  PatchEmbed, class token, E_pos
    z'_l = MSA(LN(z_{l-1})) + z_{l-1}                     (2)  Block: attention half
    z_l  = MLP(LN(z'_l)) + z'_l                           (3)  Block: MLP half
    y    = LN(z_L^0)                                      (4)  final norm, then the head

Numerics follow the official implementation (google-research/vision_transformer,
``vit_jax/models_vit.py``), which produced the paper's checkpoints:

- LayerNorm epsilon 1e-6 (flax's default; PyTorch's default is 1e-5).
- GELU is the tanh approximation (flax's ``nn.gelu`` default); ``ViTConfig.gelu="none"`` gives
  the exact erf GELU that timm and Hugging Face use.
- Attention is softmax(q k^T / sqrt(head_dim)) v.
- Dropout where vit_jax puts it: after adding E_pos, after the attention output projection,
  after each MLP dense layer; attention dropout on the attention weights.
- Initialisation (:func:`init_weights`): LeCun-normal patch embedding, Xavier-uniform dense
  kernels (q, k and v each as its own D x D matrix), zero attention biases, N(0, 1e-6) MLP
  biases, E_pos ~ N(0, 0.02), zero class token, zero head.

Where we deviate from the paper or the official code, and why:

- Eq. 4 normalises only the class token; like vit_jax we apply the final LayerNorm to every
  token (identical for the class token; "gap" pooling then averages normalised tokens, as vit_jax
  does), so that ``forward_features`` returns normalised tokens for analysis.
- Query, key and value are one fused ``Linear(D, 3D)`` (faster); the converters split it into
  the official per-projection kernels.
- ``Attention.forward`` uses PyTorch's fused ``scaled_dot_product_attention``, except on CPU for
  training in bf16 or on short sequences (eager), and inference in bf16 over many rows, where
  the same softmax with plain matmuls is faster (see ``plain_cpu_attention``; bf16 backward of
  [128, 4, 50, 32]: 83 ms fused vs 13 ms).
- The paper interpolates E_pos in 2-D once, to fine-tune at a higher resolution (Sec. 3.2);
  the model also does it on the fly for images of another size (any multiple of the patch),
  with the same function as ``vitkit convert --image-size``, so running there equals converting.
- ``drop_path`` (stochastic depth) is not in the paper; it defaults to 0 and is there for the
  data-efficient recipes.

The later members of the family (DeiT-III, DINOv2, CLIP towers, timm's ``global_pool="avg"``)
are switches of :class:`vitkit.registry.model_config.ViTConfig`, all off by default, read once in
the constructors; an absent part is an ``nn.Identity``, so ``forward`` stays one path: ``fc_norm``
(LayerNorm after pooling; the final norm becomes the identity), ``class_token`` /
``num_reg_tokens`` (prefix tokens: class token, then registers) and ``pos_embed_prefix`` (False:
E_pos is added to the patches only), ``layer_scale_init`` (``ls1`` / ``ls2``), ``norm_pre``
(LayerNorm after the embedding), ``patch_bias``, ``gelu="quick"`` (CLIP's x * sigmoid(1.702 x)),
``qk_norm``, ``mlp="swiglu"`` (DINOv2-giant), ``pool="avgmax"`` / ``"max"``, ``dist_token``
(DeiT: a second token and head; the heads' logits are averaged, :meth:`forward_heads` gives
both), ``final_norm=False`` (no Eq. 4 LayerNorm) and ``pool="map"`` (SigLIP:
:class:`~vitkit.models.map_head.MAPHead`; ``map_heads`` / ``map_mlp_dim`` / ``map_prefix``:
Perception Encoder's, over every token).
AIMv2, BEiT-3 and timm's post-norm ViT add ``norm="rmsnorm"`` (:func:`make_norm`),
``patch_norm``, ``proj_bias=False``, ``scale_attn_norm`` / ``scale_mlp_norm`` (sub-norms inside
attention and the MLP) and ``block="post"`` (z + LN(F(z)) in :class:`Block`). ``naflex``
(timm's NaFlexVit, :mod:`vitkit.models.naflex_packing`) resamples E_pos from its own grid and lets
``forward`` take a packed batch dict; attention and the MAP head then take its padding masks.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vitkit.errors import VitkitError
from vitkit.hardware import check_model_fits
from vitkit.models import features
from vitkit.models import naflex_packing as naflex
from vitkit.models.block_parts import LayerScale, Mlp, drop_path, logit_bias, make_norm
from vitkit.models.cpu_attention import plain_cpu_attention
from vitkit.models.hybrid_stem import ResNetStem
from vitkit.models.map_head import MAPHead, require_map_head
from vitkit.models.parallel_blocks import DiffAttention, ParallelScalingBlock, ParallelThingsBlock
from vitkit.models.posemb_resample import Resample, resample_pos_embed, symbolic
from vitkit.models.relpos import attention_biases, make_rel_pos
from vitkit.models.rope import RotaryEmbedding, rotate
from vitkit.models.scriptable import scriptable
from vitkit.models.sdpa_backend import sdpa_backend
from vitkit.models.timm_api import TimmModel, TimmPatchEmbed
from vitkit.models.weight_init import init_weights
from vitkit.registry.model_config import ModelConfig, ResNetConfig, ViTConfig, model_config
from vitkit.registry.timm_keywords import from_timm


class PatchEmbed(TimmPatchEmbed, nn.Module):
    """Split the image into P x P patches and project each linearly to D (the E of Eq. 1).

    A convolution with kernel = stride = P is exactly the flatten-then-linear of the paper.
    For a hybrid (Sec. 3.1) the patches are taken from a ResNet's feature map instead.
    """

    def __init__(self, cfg: ViTConfig) -> None:
        super().__init__()
        self.image_size = cfg.image_size
        self.grid_size = cfg.grid_size
        self.in_chans = cfg.in_chans
        self.stem_stride = cfg.stem_stride
        self.patch_size = cfg.patch_size
        self.stem = ResNetStem(cfg) if cfg.is_hybrid else None
        self.proj = nn.Conv2d(
            cfg.patch_in_chans,
            cfg.width,
            kernel_size=cfg.patch_size,
            stride=cfg.patch_size,
            bias=cfg.patch_bias,
        )
        self.norm = make_norm(cfg, cfg.width) if cfg.patch_norm else nn.Identity()  # AIMv2

    def grid_for(self, size: tuple[int, int]) -> tuple[int, int]:
        """The patch grid (rows, columns) of images of ``size`` (H, W): any positive multiple
        of the patch size (times the hybrid's ResNet stride) on each side. A symbolic size (an
        export with a dynamic height and width) takes the general path, so that no guard on the
        model's own size enters the graph."""
        if not symbolic(size) and size == self.image_size:
            return self.grid_size
        s = self.stem_stride
        for side, n, p in zip(("height", "width"), size, self.patch_size):
            if n < p * s or n % (p * s):
                what = f"the patch {side} {p}" + (f" x the ResNet stride {s}" if s > 1 else "")
                raise VitkitError(
                    f"input images are {size[0]}x{size[1]}: the {side} {n} is not a positive "
                    f"multiple of {what} (the model was built for "
                    f"{self.image_size[0]}x{self.image_size[1]})"
                )
        return size[0] // (self.patch_size[0] * s), size[1] // (self.patch_size[1] * s)

    def forward(self, x: Tensor) -> Tensor:
        if x.ndim != 4 or x.shape[1] != self.in_chans:
            raise VitkitError(f"expected images [B, {self.in_chans}, H, W], got {tuple(x.shape)}")
        self.grid_for((x.shape[-2], x.shape[-1]))  # refuses a size the patches do not tile
        if self.stem is not None:
            x = self.stem(x)
        x = self.proj(x)  # [B, D, H/P, W/P]
        return self.norm(x.flatten(2).transpose(1, 2))  # [B, N, D], patches in row-major order


class Attention(nn.Module):
    """Multi-head self-attention (MSA of Eq. 2).

    ``forward`` uses PyTorch's fused ``scaled_dot_product_attention``; ``forward_explicit``
    computes the softmax itself and also returns the attention weights [B, heads, T, T].
    """

    def __init__(self, cfg: ViTConfig, kv_heads: int | None = None) -> None:
        super().__init__()
        self.num_heads = cfg.num_heads
        self.head_dim = cfg.width // cfg.num_heads
        self.kv_heads = kv_heads or cfg.num_heads  # fewer: grouped-query attention (Sapiens2)
        qv_only = cfg.qkv_bias and not cfg.k_bias  # EVA / DINOv3 / BEiT: q_bias, v_bias (timm)
        qkv = cfg.width + 2 * self.kv_heads * self.head_dim
        self.qkv = nn.Linear(cfg.width, qkv, bias=cfg.qkv_bias and not qv_only)
        self.q_bias = nn.Parameter(torch.zeros(cfg.width)) if qv_only else None
        self.v_bias = nn.Parameter(torch.zeros(cfg.width)) if qv_only else None
        self.rope_half, self.num_prefix = cfg.rope_half, cfg.num_prefix_tokens  # vitkit.models.rope
        # this block's relative position bias (vitkit.models.relpos); the model computes it per
        # forward
        own = cfg.rel_pos != "none" and not cfg.rel_pos_shared
        self.rel_pos = make_rel_pos(cfg) if own else None
        self.proj = nn.Linear(cfg.width, cfg.width, bias=cfg.proj_bias)
        # BEiT-3's sub-LayerNorm on the concatenated heads, before the projection
        self.norm = make_norm(cfg, cfg.width) if cfg.scale_attn_norm else nn.Identity()
        self.attn_dropout = cfg.attn_dropout
        qk_norm = cfg.qk_norm
        self.q_norm = make_norm(cfg, self.head_dim) if qk_norm else nn.Identity()
        self.k_norm = make_norm(cfg, self.head_dim) if qk_norm else nn.Identity()
        self.attention_backend = "auto"  # SDPA's kernel (models.sdpa_backend), traced per layer

    def _split_heads(self, x: Tensor, rope: Tensor | None) -> tuple[Tensor, Tensor, Tensor]:
        b, t, _ = x.shape
        if self.q_bias is not None and self.v_bias is not None:  # the key's bias is 0
            bias = torch.cat((self.q_bias, torch.zeros_like(self.q_bias), self.v_bias))
            qkv = F.linear(x, self.qkv.weight, bias)
        else:
            qkv = self.qkv(x)
        if self.kv_heads == self.num_heads:
            qkv = qkv.reshape(b, t, 3, self.num_heads, self.head_dim)
            q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # each [B, heads, T, head_dim]
        else:  # grouped-query attention: kv_heads key / value heads
            parts = qkv.split(
                [self.num_heads * self.head_dim] + [self.kv_heads * self.head_dim] * 2, -1
            )
            q, k, v = (x.reshape(b, t, -1, self.head_dim).transpose(1, 2) for x in parts)
        q, k = self.q_norm(q), self.k_norm(k)
        if rope is not None:  # rotary position embedding of the patch tokens (vitkit.models.rope)
            q = rotate(q, rope, self.rope_half, self.num_prefix)
            k = rotate(k, rope, self.rope_half, self.num_prefix)
        if self.kv_heads == self.num_heads:
            return q, k, v
        groups = self.num_heads // self.kv_heads  # each key / value head serves this many
        return q, k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)

    def _merge_heads(self, x: Tensor) -> Tensor:
        b, _, t, _ = x.shape
        x = x.transpose(1, 2).reshape(b, t, self.num_heads * self.head_dim)
        return self.proj(self.norm(x))

    def forward(self, x: Tensor, rope: Tensor | None = None, bias: Tensor | None = None) -> Tensor:
        """``rope``: a rotary table for q / k (vitkit.models.rope); ``bias``: an additive term on
        the logits [1, heads, T, T] (relative position, vitkit.models.relpos)."""
        q, k, v = self._split_heads(x, rope)
        cpu = q.device.type == "cpu"
        # PyTorch's CPU flash kernel is ~6x slower than plain matmuls in bf16 (backward) and
        # 1.4-2.9x slower in fp32 for short sequences over many rows in training; inference:
        # plain_cpu_attention. The ONNX exporter cannot decompose the fused kernel with a float
        # mask (torch 2.13). Compiled: bf16 only (no guard on a graph's dynamic batch).
        bf16 = q.dtype == torch.bfloat16
        if torch.compiler.is_compiling():
            plain = cpu and bf16
        else:
            rows, grad = q.shape[0] * q.shape[1], torch.is_grad_enabled()
            plain = cpu and plain_cpu_attention(rows, q.shape[-2], bf16=bf16, grad=grad)
        if plain or (bias is not None and torch.compiler.is_exporting()):
            return self._merge_heads(self._attend(q, k, v, bias)[0])
        p = self.attn_dropout if self.training else 0.0
        mask = None if bias is None else logit_bias(bias, q.dtype)
        with sdpa_backend(self.attention_backend):  # inside the code torch.compile traces
            return self._merge_heads(F.scaled_dot_product_attention(q, k, v, mask, dropout_p=p))

    def forward_explicit(
        self, x: Tensor, rope: Tensor | None = None, bias: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        out, weights = self._attend(*self._split_heads(x, rope), bias)
        return self._merge_heads(out), weights

    def _attend(
        self, q: Tensor, k: Tensor, v: Tensor, bias: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        logits = (q * self.head_dim**-0.5) @ k.transpose(-2, -1)
        weights = torch.softmax(logits if bias is None else logits + logit_bias(bias, q.dtype), -1)
        dropped = F.dropout(weights, self.attn_dropout, self.training)
        return dropped @ v, weights


class Block(nn.Module):
    """One pre-LayerNorm encoder block: Eq. 2 then Eq. 3. With ``block="post"`` the norm
    moves onto the branch's output, z + LN(F(z)) (timm's ``ResPostBlock``; not the paper's)."""

    def __init__(self, cfg: ViTConfig, drop_path_rate: float = 0.0, index: int = 0) -> None:
        super().__init__()
        self.norm1 = make_norm(cfg, cfg.width)
        self.attn = Attention(cfg, cfg.kv_heads[index] if cfg.kv_heads else None)
        self.norm2 = make_norm(cfg, cfg.width)
        self.post_norm = cfg.block == "post"
        self.mlp = Mlp(cfg)
        self.drop = nn.Dropout(cfg.dropout)
        self.drop_path_rate = drop_path_rate
        scale = cfg.layer_scale_init
        self.ls1 = LayerScale(cfg.width, scale) if scale is not None else nn.Identity()
        mlp_scale = scale if cfg.layer_scale_mlp else None  # (Sapiens2: attention only)
        self.ls2 = LayerScale(cfg.width, mlp_scale) if mlp_scale is not None else nn.Identity()

    def _residual(self, x: Tensor, branch: Tensor) -> Tensor:
        return x + drop_path(branch, self.drop_path_rate, self.training)

    def forward(self, x: Tensor, rope: Tensor | None = None, bias: Tensor | None = None) -> Tensor:
        """``rope`` / ``bias``: the attention's rotary table / additive logit bias, if any."""
        if self.post_norm:  # timm's ResPostBlock: z + LN(MSA(z)), then z + LN(MLP(z))
            x = self._residual(x, self.norm1(self.drop(self.attn(x, rope, bias))))
            return self._residual(x, self.norm2(self.mlp(x)))
        x = self._residual(x, self.ls1(self.drop(self.attn(self.norm1(x), rope, bias))))  # (2)
        return self._residual(x, self.ls2(self.mlp(self.norm2(x))))  # (3)

    def forward_explicit(
        self, x: Tensor, rope: Tensor | None = None, bias: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        """As ``forward``, with the explicit-softmax attention; also returns its weights."""
        if self.post_norm:
            attn_out, weights = self.attn.forward_explicit(x, rope, bias)
            x = self._residual(x, self.norm1(self.drop(attn_out)))
            return self._residual(x, self.norm2(self.mlp(x))), weights
        attn_out, weights = self.attn.forward_explicit(self.norm1(x), rope, bias)
        x = self._residual(x, self.ls1(self.drop(attn_out)))
        return self._residual(x, self.ls2(self.mlp(self.norm2(x)))), weights


def make_block(cfg: ViTConfig, index: int, drop_path_rate: float) -> nn.Module:
    """Block ``index``: the paper's (Eq. 2-3), or a parallel one (vitkit.models.parallel_blocks)."""
    s = cfg.layer_scale_init
    scale = (lambda: LayerScale(cfg.width, s)) if s is not None else nn.Identity
    if cfg.parallel_scaling:  # ViT-22B: attention and MLP from one LayerNorm
        return ParallelScalingBlock(cfg, index, drop_path_rate, scale)
    attn = (lambda: DiffAttention(cfg, index)) if cfg.diff_attn else (lambda: Attention(cfg))
    if cfg.parallel > 1:  # "Three things": N attention branches, then N MLP branches
        return ParallelThingsBlock(cfg, drop_path_rate, attn, lambda: Mlp(cfg), scale)
    block = Block(cfg, drop_path_rate, index)
    if cfg.diff_attn:  # differential attention in place of Eq. 2's MSA
        block.add_module("attn", attn())
    return block


@dataclass
class WithAttentions:
    """What :meth:`VisionTransformer.forward_with_attentions` returns.

    hidden_states: z_0 (embeddings) then the output z_l of every block: depth + 1 tensors [B, T, D].
    attentions: every block's attention weights [B, heads, T, T] (softmax over the last axis).
    features: the final-normalised tokens [B, T, D] (what ``forward_features`` returns).
    logits: the head's output [B, num_classes].
    pool_attention: with ``pool="map"``, the MAP probe's attention over the patch tokens
    [B, heads, N] (``map_prefix``: over every token, [B, heads, T]); None for other poolings.
    """

    hidden_states: list[Tensor]
    attentions: list[Tensor]
    features: Tensor
    logits: Tensor
    pool_attention: Tensor | None = None


class VisionTransformer(TimmModel, nn.Module):
    """ViT: a pure function of normalised pixels [B, C, H, W] to logits [B, num_classes].
    (timm's attributes and methods: :mod:`vitkit.models.timm_api`.)"""

    pre_logits: nn.Sequential | nn.Identity  # Linear + Tanh with representation_size, else none
    pos_embed: nn.Parameter | None  # E_pos; None with abs_pos_embed=False (DINOv3, RoPE-ViT)

    def __init__(self, cfg: ViTConfig) -> None:
        super().__init__()
        self.cfg = cfg
        d = cfg.width
        self.patch_embed = PatchEmbed(cfg)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, d)) if cfg.has_class_token else None
        self.dist_token = nn.Parameter(torch.zeros(1, 1, d)) if cfg.dist_token else None
        regs = cfg.num_reg_tokens
        self.reg_token = nn.Parameter(torch.zeros(1, regs, d)) if regs else None
        rows = naflex.pos_rows(cfg) if cfg.naflex else cfg.num_pos_prefix + cfg.num_patches
        # (NaFlex: E_pos on its own grid; none with abs_pos_embed=False)
        self.pos_embed = nn.Parameter(torch.zeros(1, rows, d)) if cfg.abs_pos_embed else None
        self.rope = RotaryEmbedding(cfg) if cfg.rope != "none" else None  # vitkit.models.rope
        shared = cfg.rel_pos_shared  # one relative position bias for every block (models.relpos)
        self.shared_rel_pos = make_rel_pos(cfg) if shared else None
        self.pos_drop = nn.Dropout(cfg.dropout)
        self.norm_pre = make_norm(cfg, d) if cfg.norm_pre else nn.Identity()
        rates = [cfg.drop_path * i / max(cfg.depth - 1, 1) for i in range(cfg.depth)]
        self.blocks = nn.ModuleList(make_block(cfg, i, r) for i, r in enumerate(rates))
        self.feature_info = features.block_feature_info(cfg)  # timm's: every block
        # With fc_norm the LayerNorm moves from every token (Eq. 4) to the pooled features.
        final = cfg.final_norm and not cfg.fc_norm
        self.norm = make_norm(cfg, d) if final else nn.Identity()
        self.fc_norm = make_norm(cfg, d) if cfg.fc_norm else nn.Identity()
        self.attn_pool = MAPHead(cfg) if cfg.pool == "map" else None  # SigLIP
        if cfg.representation_size:
            self.pre_logits = nn.Sequential(nn.Linear(d, cfg.representation_size), nn.Tanh())
        else:
            self.pre_logits = nn.Identity()
        self.head_drop = nn.Dropout(cfg.head_dropout)  # (timm's drop_rate; not in the paper)
        self.head = nn.Linear(cfg.feature_dim, cfg.num_classes) if cfg.num_classes else None
        distilled = cfg.dist_token and cfg.num_classes
        self.head_dist = nn.Linear(d, cfg.num_classes) if distilled else None  # DeiT
        init_weights(self, lambda b: isinstance(b, Block))

    def embed(self, x: Tensor) -> Tensor:
        """Eq. 1: patch embeddings, class token prepended, position embeddings added."""
        patches = self.patch_embed(x)
        return self.embed_patches(patches, self.patch_embed.grid_for((x.shape[-2], x.shape[-1])))

    def embed_patches(self, patches: Tensor, grid: tuple[int, int] | None = None) -> Tensor:
        """Eq. 1 from the patch embeddings x_p E [B, N, D] on: class token prepended, E_pos
        added. ``grid`` is the patches' (rows, columns), the model's own grid when not given.
        (Masked patch prediction corrupts the patch embeddings before this step.)"""
        grid = self.patch_embed.grid_size if grid is None else grid
        if grid[0] * grid[1] != patches.shape[1]:
            raise VitkitError(
                f"{patches.shape[1]} patch embeddings do not fill a {grid[0]}x{grid[1]} grid; "
                "pass embed_patches the grid they come from"
            )
        pos_embed = self.pos_embed_for(grid)
        prefix = [
            t.expand(patches.shape[0], -1, -1)
            for t in (self.cls_token, self.dist_token, self.reg_token)
            if t is not None
        ]
        if pos_embed is None:  # no E_pos (rotary embeddings or a relative position bias)
            x = torch.cat([*prefix, patches], dim=1)
        elif self.cfg.pos_embed_prefix:
            x = torch.cat([*prefix, patches], dim=1) + pos_embed
        else:  # E_pos covers the patches only (timm's no_embed_class)
            x = torch.cat([*prefix, patches + pos_embed], dim=1)
        return self.norm_pre(self.pos_drop(x))

    def pos_embed_for(self, grid: tuple[int, int]) -> Tensor | None:
        """E_pos [1, T, D] for a patch grid: the learned table on the model's own grid (the
        parameter itself), else the table interpolated in 2-D with ``self.resample`` — the
        paper's resolution change (Sec. 3.2), the same as ``vitkit convert --image-size``."""
        if self.cfg.naflex and self.pos_embed is not None:  # timm's NaFlexVit: from its own
            return naflex.pos_embed_for_grid(self.pos_embed, self.cfg, grid)  # grid, as timm
        own = self.patch_embed.grid_size
        if self.pos_embed is None or (not symbolic(grid) and grid == own):
            return self.pos_embed  # (a symbolic grid resamples: the identity at its own grid)
        return resample_pos_embed(self.pos_embed, own, grid, self.cfg.num_pos_prefix, self.resample)

    @property
    def resample(self) -> Resample:
        """E_pos's kernel at another grid: ``cfg.pos_resample`` (the source's; settable)."""
        return self.cfg.pos_resample

    @resample.setter
    def resample(self, mode: Resample) -> None:  # (the config's: a saved checkpoint keeps it)
        self.cfg = self.cfg.replace(pos_resample=mode)

    def rope_for(self, grid: tuple[int, int] | None) -> list[Tensor | None]:
        """Each block's rotary table for a patch grid (the model's own when None); None each
        without ``rope``."""
        if self.rope is None:
            return [None] * self.cfg.depth
        dtype = self.patch_embed.proj.weight.dtype
        return list(self.rope(self.patch_embed.grid_size if grid is None else grid, dtype))

    def encode(self, tokens: Tensor, grid: tuple[int, int] | None = None) -> Tensor:
        """Eq. 2-3 for every block, then the final LayerNorm: [B, T, D] → [B, T, D]. ``grid``:
        the patches' (rows, columns), which rotary embeddings and a relative position bias
        need (the model's own if None)."""
        ropes, biases = self.rope_for(grid), self.attention_biases(tokens, grid)
        for block, rope, bias in zip(self.blocks, ropes, biases):
            tokens = features.run_block(self, block, tokens, rope, bias)
        return self.norm(tokens)

    def attention_biases(self, tokens: Tensor, grid: tuple[int, int] | None) -> list[Tensor | None]:
        """Each block's relative position bias for ``tokens`` on ``grid`` (vitkit.models.relpos)."""
        if self.cfg.rel_pos == "none":
            return [None] * len(self.blocks)
        grid = self.patch_embed.grid_size if grid is None else grid
        if tokens.shape[1] != self.cfg.num_prefix_tokens + grid[0] * grid[1]:
            raise VitkitError(
                f"{tokens.shape[1]} tokens are not the prefix and a {grid[0]}x{grid[1]} patch "
                "grid; the relative position bias needs every patch of the grid"
            )
        return attention_biases(self.blocks, self.shared_rel_pos, grid)

    def forward_features(
        self, x: Tensor, attn_mask: Tensor | None = None, is_causal: bool = False
    ) -> Tensor:
        """Pixels → final-normalised tokens [B, T, D] (class token first when there is one).
        ``attn_mask`` / ``is_causal``: timm's masked attention (``forward_intermediates``')."""
        if attn_mask is not None or is_causal:
            masked = features.forward_intermediates(
                self, x, 1, attn_mask=attn_mask, is_causal=is_causal
            )
            return cast(Tensor, masked[0])
        return self.encode(self.embed(x), self.patch_embed.grid_for((x.shape[-2], x.shape[-1])))

    def pool(self, tokens: Tensor) -> Tensor:
        """Eq. 4's z_L^0 (the class token), or with ``pool="gap"`` the mean over the patch
        tokens (prefix tokens left out; "map": the MAP head over them), then ``fc_norm`` where
        the config has it."""
        if self.cfg.pool in ("token", "none"):  # ("none": every token, timm's global_pool="")
            return self.fc_norm(tokens[:, 0] if self.cfg.pool == "token" else tokens)
        patches = tokens[:, self.cfg.num_prefix_tokens :]
        require_map_head(self.cfg, self.attn_pool)
        if self.attn_pool is not None:  # (map_prefix: over every token, as timm's Eva)
            return self.fc_norm(self.attn_pool(tokens if self.cfg.map_prefix else patches))
        if self.cfg.pool == "token_gap":  # HF Dinov2's classifier input (no fc_norm allowed)
            return torch.cat([tokens[:, 0], patches.mean(dim=1)], dim=-1)
        if self.cfg.pool == "max":  # timm's global_pool="max" / "avgmax"
            return self.fc_norm(patches.amax(dim=1))
        if self.cfg.pool == "avgmax":
            return self.fc_norm((patches.amax(dim=1) + patches.mean(dim=1)) / 2)
        return self.fc_norm(patches.mean(dim=1))

    def forward_head(self, tokens: Tensor, pre_logits: bool = False) -> Tensor:
        """Tokens → logits; with ``pre_logits=True`` the features just before the head."""
        return self._classify(self.pool(tokens), tokens, pre_logits)

    def _classify(self, pooled: Tensor, tokens: Tensor, pre_logits: bool) -> Tensor:
        x = self.head_drop(self.pre_logits(pooled))
        if self.cfg.dist_token and self.cfg.pool != "none":  # DeiT: its own head, averaged
            if pre_logits or self.head is None or self.head_dist is None:
                return (x + tokens[:, 1]) / 2
            return (self.head(x) + self.head_dist(tokens[:, 1])) / 2
        if pre_logits or self.head is None:
            return x
        return self.head(x)

    def forward(
        self,
        x: Tensor | dict[str, Tensor],
        attn_mask: Tensor | None = None,
        is_causal: bool = False,
    ) -> Tensor:
        """Pixels [B, C, H, W], or a NaFlex batch dict (``patches``, ``patch_coord``,
        ``patch_valid``: :func:`vitkit.models.naflex_packing.pack`) for a NaFlex model."""
        if isinstance(x, dict) and attn_mask is None and not is_causal:
            return naflex.forward(self, x)
        if isinstance(x, dict):
            raise VitkitError("a NaFlex batch carries its own mask: no attn_mask / is_causal")
        return self.forward_head(self.forward_features(x, attn_mask, is_causal))

    def forward_heads(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """DeiT's training outputs: the class head's and the distillation head's logits, each
        [B, num_classes] (``forward`` averages them; timm's ``set_distilled_training(True)``)."""
        if self.head is None or self.head_dist is None:
            raise VitkitError("forward_heads needs a distilled model (dist_token) with a head")
        tokens = self.forward_features(x)
        return self.head(tokens[:, 0]), self.head_dist(tokens[:, 1])

    def forward_intermediates(
        self,
        x: Tensor | dict[str, Tensor],
        indices: features.Indices = None,
        return_prefix_tokens: bool = False,
        norm: bool = False,
        stop_early: bool = False,
        output_fmt: str = "NCHW",
        intermediates_only: bool = False,
        output_dict: bool = False,
        attn_mask: Tensor | None = None,
        is_causal: bool = False,
    ) -> Any:
        """timm's ``forward_intermediates``: chosen blocks' features as maps or token lists
        (:func:`vitkit.models.features.forward_intermediates`)."""
        return features.forward_intermediates(
            self, x, indices, return_prefix_tokens, norm, stop_early, output_fmt,
            intermediates_only, output_dict, attn_mask, is_causal,
        )  # fmt: skip

    def prune_intermediate_layers(
        self, indices: features.Indices = 1, prune_norm: bool = False, prune_head: bool = True
    ) -> list[int]:
        """timm's: drop the blocks after ``indices`` (:mod:`vitkit.models.features`)."""
        return features.prune_intermediate_layers(self, indices, prune_norm, prune_head)

    def __prepare_scriptable__(self) -> nn.Module:
        """What ``torch.jit.script(model)`` compiles: this model's forward over its own
        parameters (:mod:`vitkit.models.scriptable`; other families refused in one line)."""
        return scriptable(self)

    def forward_with_attentions(self, x: Tensor) -> WithAttentions:
        """Every hidden state and attention map, through the explicit-softmax attention."""
        grid = self.patch_embed.grid_for((x.shape[-2], x.shape[-1]))
        ropes = self.rope_for(grid)
        x = self.embed(x)
        hidden, attentions = [x], []
        for block, rope, bias in zip(_blocks(self), ropes, self.attention_biases(x, grid)):
            x, weights = (
                block.forward_explicit(x)
                if rope is None and bias is None
                else block.forward_explicit(x, rope, bias)
            )
            hidden.append(x)
            attentions.append(weights)
        features = self.norm(x)
        if self.attn_pool is None:
            return WithAttentions(hidden, attentions, features, self.forward_head(features))
        prefix = 0 if self.cfg.map_prefix else self.cfg.num_prefix_tokens
        pooled, pool_attention = self.attn_pool.forward_explicit(features[:, prefix:])
        logits = self._classify(self.fc_norm(pooled), features, pre_logits=False)
        return WithAttentions(hidden, attentions, features, logits, pool_attention)


def _blocks(model: VisionTransformer) -> Iterable[Block]:
    """``model.blocks`` as what it holds (a ModuleList is typed as holding any Module)."""
    return cast("Iterable[Block]", model.blocks)


def build_model(cfg: ModelConfig) -> nn.Module:
    """The network a config describes (a :class:`VisionTransformer`, plain or hybrid, or BiT's
    ``ResNetV2``); refused before it is built where its weights do not fit in memory."""
    check_model_fits(cfg)
    if isinstance(cfg, ResNetConfig):
        from vitkit.models.bit import ResNetV2

        return ResNetV2(cfg)
    return VisionTransformer(cfg)


def create_model(name: str | ModelConfig, **overrides: Any) -> nn.Module:
    """A freshly initialised model: ``create_model("B/16")``, ``create_model("vit_s16",
    num_classes=10, image_size=(96, 128))``, the paper's hybrids (``"r50_vit_b16"``), BiT
    ResNets (``"bit_r50x1"``, ``layers=(1, 1, 1)``), or from a config plus overrides.
    ``features_only=True`` (with ``out_indices``, default the last 3 blocks, ``output_fmt``,
    ``feature_norm``) gives timm's features-only model
    (:class:`~vitkit.models.features.FeaturesModel`)."""
    options = features.pop_features_options(overrides)
    overrides = from_timm(overrides)  # timm's keywords (img_size=, drop_path_rate=, ...)
    if "checkpoint_path" in overrides:  # (vitkit.create_model loads them)
        raise VitkitError("weights to load: vitkit.create_model(name, checkpoint_path=PATH)")
    if isinstance(name, (ViTConfig, ResNetConfig)):
        model = build_model(name.replace(**overrides))
    else:
        model = build_model(model_config(name, **overrides))
    return model if options is None else features.features_model(model, options)
