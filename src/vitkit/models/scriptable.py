"""``torch.jit.script`` of a Vision Transformer: Eq. 1-4 in the Python TorchScript compiles.

``torch.jit.script(model)`` calls the model's ``__prepare_scriptable__``, which returns
:class:`ScriptableViT`: a module built from the model's own parts (the same ``Parameter``
objects, the same names in ``state_dict()``, so timm's and vitkit's checkpoints load into the
scripted module as into the eager one) whose ``forward`` is the eager model's, with the family's
switches read once at build time instead of on every call:

    z_0  = [x_class; x_dist; x_reg; x_p^1 E; ...; x_p^N E] + E_pos   (1)  ScriptableViT.embed
    z'_l = MSA(LN(z_{l-1})) + z_{l-1}                                  (2)  ScriptableBlock
    z_l  = MLP(LN(z'_l)) + z'_l                                        (3)  ScriptableBlock
    y    = head(pool(LN(z_L)))                                         (4)  ScriptableViT.forward

It runs what the eager model runs, to the same numbers: E_pos resampled to any multiple of the
patch (the model's kernel), the CPU attention kernel the eager model picks
(:func:`~vitkit.models.cpu_attention.plain_attention_rule`), stochastic depth and dropout in
training mode. ``forward`` takes pixels [B, C, H, W] and answers as ``model(x)`` does (the
logits, or a headless model's pooled features, or every token with ``pool="none"``); a model read
from a transformers folder scripts as that call, not transformers' keyword call.

Covered: the paper's ViT and the family's switches that keep one pre- or post-norm block per
layer: class token or none, registers (DINOv2), DeiT's distillation token and heads, E_pos on
the prefix or the patches only, layer scale (CaiT, DeiT-III, DINOv2), qk-norm, q / v biases only,
grouped-query attention, SwiGLU, every GELU, RMSNorm, ``norm_pre`` (CLIP), every pooling (class
token, average, max, MAP as SigLIP's), ``fc_norm``, the tanh pre-logits, a pruned model.
Refused in one line, naming the family and the ways that run it (``torch.jit.trace``,
``torch.compile``, ``torch.export``): rotary embeddings (DINOv3, RoPE-ViT, EVA-02, PE), relative
position biases (BEiT), NaFlex, parallel blocks (ViT-22B, "three things"), differential
attention and the hybrid's ResNet stem.
"""

from typing import Any, NoReturn

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vitkit.errors import VitkitError
from vitkit.models.block_parts import drop_path
from vitkit.models.cpu_attention import avx512_kernels, plain_attention_rule
from vitkit.models.posemb_resample import resample_grid

_ALTERNATIVES = (
    "use torch.jit.trace(model, x), torch.compile(model) or torch.export.export(model, (x,)), "
    "which run it as it is"
)


def refuse_script(what: str) -> NoReturn:
    """``torch.jit.script`` of ``what`` (a model this module does not cover), refused in one
    line that names the ways that run it."""
    raise VitkitError(f"torch.jit.script does not compile {what}; {_ALTERNATIVES}")


def unscriptable_family(cfg: Any) -> str | None:
    """The family of a ViT config that :class:`ScriptableViT` does not cover, or None."""
    families = (
        (cfg.naflex, "NaFlex (packed batches of any aspect ratio)"),
        (cfg.rope != "none", "rotary position embeddings (DINOv3, RoPE-ViT, EVA-02, PE)"),
        (cfg.rel_pos != "none", "relative position biases (BEiT, timm's relpos ViTs)"),
        (cfg.parallel > 1 or cfg.parallel_scaling, "parallel blocks (ViT-22B, three things)"),
        (cfg.diff_attn, "differential attention"),
        (cfg.is_hybrid, "hybrid (a ResNet stem under the patch embedding)"),
    )
    return next((name for refused, name in families if refused), None)


def scriptable(model: Any) -> "ScriptableViT":
    """``model`` (a :class:`~vitkit.models.vit.VisionTransformer`) as a module TorchScript
    compiles, sharing its parameters; a family it does not cover is refused in one line."""
    family = unscriptable_family(model.cfg)
    if family is not None:
        refuse_script(f"{family} models")
    backends = {block.attn.attention_backend for block in model.blocks}
    if backends != {"auto"}:
        raise VitkitError(
            f"torch.jit.script keeps PyTorch's attention kernel choice: set every block's "
            f"attention_backend to 'auto' (not {sorted(backends - {'auto'})}) or {_ALTERNATIVES}"
        )
    return ScriptableViT(model)


class ScriptableAttention(nn.Module):
    """MSA of Eq. 2 over the eager ``Attention``'s parts: q, k, v from one projection (or
    q / v biases only), qk-norm, softmax(q k^T / sqrt(d)) v with the kernel eager picks."""

    q_bias: Tensor | None
    v_bias: Tensor | None

    def __init__(self, attn: Any, avx512: bool) -> None:
        super().__init__()
        self.qkv, self.proj, self.norm = attn.qkv, attn.proj, attn.norm
        self.q_norm, self.k_norm = attn.q_norm, attn.k_norm
        self.q_bias, self.v_bias = attn.q_bias, attn.v_bias
        self.num_heads: int = attn.num_heads
        self.kv_heads: int = attn.kv_heads
        self.head_dim: int = attn.head_dim
        self.attn_dropout: float = attn.attn_dropout
        self.avx512 = avx512  # this CPU's, when scripted (only the kernel choice reads it)

    def forward(self, x: Tensor) -> Tensor:
        b, t = x.shape[0], x.shape[1]
        q_bias, v_bias = self.q_bias, self.v_bias
        if q_bias is not None and v_bias is not None:  # the key's bias is 0
            bias = torch.cat((q_bias, torch.zeros_like(q_bias), v_bias))
            qkv = F.linear(x, self.qkv.weight, bias)
        else:
            qkv = self.qkv(x)
        h, d = self.num_heads, self.head_dim
        if self.kv_heads == h:
            q, k, v = qkv.reshape(b, t, 3, h, d).permute(2, 0, 3, 1, 4).unbind(0)
        else:  # grouped-query attention: each key / value head serves h // kv_heads queries
            parts = qkv.split([h * d, self.kv_heads * d, self.kv_heads * d], -1)
            q = parts[0].reshape(b, t, h, d).transpose(1, 2)
            k = parts[1].reshape(b, t, self.kv_heads, d).transpose(1, 2)
            v = parts[2].reshape(b, t, self.kv_heads, d).transpose(1, 2)
            k = k.repeat_interleave(h // self.kv_heads, 1)
            v = v.repeat_interleave(h // self.kv_heads, 1)
        q, k = self.q_norm(q), self.k_norm(k)
        bf16, grad = q.dtype == torch.bfloat16, torch.is_grad_enabled()
        rows, cpu = q.shape[0] * q.shape[1], q.device.type == "cpu"
        if cpu and plain_attention_rule(rows, q.shape[-2], bf16, grad, self.avx512):
            weights = torch.softmax((q * d**-0.5) @ k.transpose(-2, -1), -1)
            out = F.dropout(weights, self.attn_dropout, self.training) @ v
        else:
            p = self.attn_dropout if self.training else 0.0
            out = F.scaled_dot_product_attention(q, k, v, dropout_p=p)
        return self.proj(self.norm(out.transpose(1, 2).reshape(b, t, h * d)))


class ScriptableBlock(nn.Module):
    """Eq. 2 then Eq. 3 over the eager ``Block``'s parts (pre-norm, or timm's post-norm
    z + LN(F(z))), layer scale and stochastic depth as there."""

    def __init__(self, block: Any, avx512: bool) -> None:
        super().__init__()
        self.norm1, self.norm2 = block.norm1, block.norm2
        self.attn = ScriptableAttention(block.attn, avx512)
        self.mlp, self.drop, self.ls1, self.ls2 = block.mlp, block.drop, block.ls1, block.ls2
        self.post_norm: bool = block.post_norm
        self.drop_path_rate: float = block.drop_path_rate

    def forward(self, x: Tensor) -> Tensor:
        rate = self.drop_path_rate
        if self.post_norm:  # timm's ResPostBlock
            x = x + drop_path(self.norm1(self.drop(self.attn(x))), rate, self.training)
            return x + drop_path(self.norm2(self.mlp(x)), rate, self.training)
        x = x + drop_path(self.ls1(self.drop(self.attn(self.norm1(x)))), rate, self.training)
        return x + drop_path(self.ls2(self.mlp(self.norm2(x))), rate, self.training)


class ScriptablePatchEmbed(nn.Module):
    """E of Eq. 1: the patch projection (and its norm), with the eager model's size check."""

    patch_size: list[int]

    def __init__(self, patch_embed: Any) -> None:
        super().__init__()
        self.proj, self.norm = patch_embed.proj, patch_embed.norm
        self.in_chans: int = patch_embed.in_chans
        self.patch_size = list(patch_embed.patch_size)

    def grid_for(self, x: Tensor) -> list[int]:
        """The patch grid (rows, columns) of images ``x``; refused where the patches do not
        tile them."""
        if x.dim() != 4 or x.shape[1] != self.in_chans:
            raise ValueError(f"expected images [B, {self.in_chans}, H, W], got {x.shape}")
        h, w = x.shape[2], x.shape[3]
        ph, pw = self.patch_size[0], self.patch_size[1]
        if h < ph or w < pw or h % ph != 0 or w % pw != 0:
            raise ValueError(f"input images are {h}x{w}: not positive multiples of {ph}x{pw}")
        return [h // ph, w // pw]

    def forward(self, x: Tensor) -> Tensor:
        return self.norm(self.proj(x).flatten(2).transpose(1, 2))  # [B, N, D], row-major


class ScriptableViT(nn.Module):
    """The eager model's ``forward`` (Eq. 1-4) over its own parameters; see the module."""

    cls_token: Tensor | None
    dist_token: Tensor | None
    reg_token: Tensor | None
    pos_embed: Tensor | None
    grid: list[int]

    def __init__(self, model: Any) -> None:
        super().__init__()
        cfg, avx512 = model.cfg, avx512_kernels()
        self.patch_embed = ScriptablePatchEmbed(model.patch_embed)
        self.cls_token, self.dist_token = model.cls_token, model.dist_token
        self.reg_token, self.pos_embed = model.reg_token, model.pos_embed
        self.grid = list(model.patch_embed.grid_size)  # E_pos's own
        self.pos_prefix: int = cfg.num_pos_prefix  # prefix rows in E_pos (0: patches only)
        self.resample: str = cfg.pos_resample  # E_pos's kernel at another grid
        self.pos_drop, self.norm_pre = model.pos_drop, model.norm_pre
        self.blocks = nn.ModuleList(ScriptableBlock(b, avx512) for b in model.blocks)
        self.norm, self.fc_norm, self.attn_pool = model.norm, model.fc_norm, model.attn_pool
        self.pool: str = cfg.pool
        self.num_prefix: int = cfg.num_prefix_tokens
        self.map_prefix: bool = cfg.map_prefix  # the MAP head over every token (PE)
        self.distilled: bool = cfg.dist_token and cfg.pool != "none"  # DeiT's two heads
        self.pre_logits, self.head_drop = model.pre_logits, model.head_drop
        self.head, self.head_dist = model.head, model.head_dist
        self.train(model.training)

    def embed(self, x: Tensor) -> Tensor:
        """Eq. 1: patch embeddings, prefix tokens prepended, E_pos (resampled) added."""
        grid = self.patch_embed.grid_for(x)
        patches = self.patch_embed(x)
        b = patches.shape[0]
        tokens: list[Tensor] = []
        for token in (self.cls_token, self.dist_token, self.reg_token):
            if token is not None:
                tokens.append(token.expand(b, -1, -1))
        pos = self.pos_embed
        if pos is not None and grid != self.grid:
            pos = resample_grid(pos, self.grid, grid, self.pos_prefix, self.resample)
        if pos is None:
            x = torch.cat(tokens + [patches], dim=1)
        elif self.pos_prefix:
            x = torch.cat(tokens + [patches], dim=1) + pos
        else:  # E_pos on the patches only (timm's no_embed_class)
            x = torch.cat(tokens + [patches + pos], dim=1)
        return self.norm_pre(self.pos_drop(x))

    def forward_features(self, x: Tensor) -> Tensor:
        """Pixels → final-normalised tokens [B, T, D] (Eq. 1-3, then Eq. 4's LayerNorm)."""
        x = self.embed(x)
        for block in self.blocks:
            x = block(x)
        return self.norm(x)

    def pool_tokens(self, tokens: Tensor) -> Tensor:
        """Eq. 4's z_L^0, or the pooling the config names, then ``fc_norm``."""
        if self.pool == "token":
            return self.fc_norm(tokens[:, 0])
        if self.pool == "none":
            return self.fc_norm(tokens)
        patches = tokens[:, self.num_prefix :]
        if self.attn_pool is not None:  # (a module or None: TorchScript keeps one branch)
            return self.fc_norm(self.attn_pool(tokens if self.map_prefix else patches))
        if self.pool == "map":
            raise ValueError("this model's MAP head was pruned: take its forward_features")
        if self.pool == "token_gap":
            return torch.cat([tokens[:, 0], patches.mean(dim=1)], dim=-1)
        if self.pool == "max":
            return self.fc_norm(patches.amax(dim=1))
        if self.pool == "avgmax":
            return self.fc_norm((patches.amax(dim=1) + patches.mean(dim=1)) / 2)
        return self.fc_norm(patches.mean(dim=1))

    def forward_head(self, tokens: Tensor, pre_logits: bool = False) -> Tensor:
        """Tokens → logits; with ``pre_logits=True`` the features just before the head."""
        x = self.head_drop(self.pre_logits(self.pool_tokens(tokens)))
        if pre_logits or self.head is None:
            return (x + tokens[:, 1]) / 2 if self.distilled else x
        if self.distilled and self.head_dist is not None:  # DeiT: the two heads, averaged
            return (self.head(x) + self.head_dist(tokens[:, 1])) / 2
        return self.head(x)

    def forward(self, x: Tensor) -> Tensor:
        """Pixels [B, C, H, W] → what the eager ``model(x)`` returns."""
        return self.forward_head(self.forward_features(x))
