"""Multi-head attention pooling (big_vision's ``MAPHead``, used by SigLIP): the head a
``pool="map"`` model pools its patch tokens with instead of the class token. Not in the paper."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from vitkit.errors import VitkitError
from vitkit.models.block_parts import Mlp
from vitkit.registry.model_config import ViTConfig


class MAPHead(nn.Module):
    """Multi-head attention pooling ("MAP"; big_vision's ``MAPHead``, used by SigLIP).

    A learned probe (one query token) attends over the patch tokens with multi-head attention;
    the result goes through a residual MLP after a LayerNorm, like one more encoder block whose
    only query is the probe:  y = a + MLP(LN(a)),  a = MHA(probe, z_L).  Not in the paper.
    """

    def __init__(self, cfg: ViTConfig) -> None:
        super().__init__()
        d = cfg.width
        self.num_heads = cfg.map_heads or cfg.num_heads  # (Perception Encoder: 8)
        self.head_dim = d // self.num_heads
        self.latent = nn.Parameter(torch.zeros(1, 1, d))  # the probe (timm's name)
        self.q = nn.Linear(d, d)
        self.kv = nn.Linear(d, 2 * d)
        self.proj = nn.Linear(d, d)
        self.norm = nn.LayerNorm(d, eps=cfg.layer_norm_eps)
        self.mlp = Mlp(cfg, cfg.map_mlp_dim)

    def forward(self, tokens: Tensor, mask: Tensor | None = None) -> Tensor:
        """Tokens [B, N, D] → pooled features [B, D]; ``mask``: additive [B, 1, 1, N] (NaFlex)."""
        return self.forward_explicit(tokens, mask)[0]

    def forward_explicit(self, tokens: Tensor, mask: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """Pooled features [B, D] and the probe's attention weights [B, heads, N]."""
        b, n, d = tokens.shape
        q = self.q(self.latent).reshape(1, self.num_heads, 1, self.head_dim)
        kv = self.kv(tokens).reshape(b, n, 2, self.num_heads, self.head_dim)
        k, v = kv.permute(2, 0, 3, 1, 4).unbind(0)  # each [B, heads, N, head_dim]
        scores = (q * self.head_dim**-0.5) @ k.transpose(-2, -1)
        weights = torch.softmax(scores if mask is None else scores + mask, dim=-1)
        x = self.proj((weights @ v).reshape(b, d))  # heads concatenated, as in Eq. 2's MSA
        return x + self.mlp(self.norm(x)), weights[:, :, 0]


def require_map_head(cfg: ViTConfig, head: MAPHead | None) -> None:
    """Refuse to pool a ``pool="map"`` model whose MAP head was pruned (another pooling in its
    place would be a silent, different number)."""
    if cfg.pool == "map" and head is None:
        raise VitkitError(
            "this model's MAP head was pruned (prune_head): take its tokens with "
            "forward_features or forward_intermediates"
        )
