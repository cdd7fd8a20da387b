"""Self-supervised pre-training objectives for vitkit's ViT.

- :mod:`.mpp`: the paper's masked patch prediction (corruption of patch embeddings, 3-bit mean
  colour targets, the downsized and L2 variants);
- :mod:`.mae`: the masked autoencoder (encoder on visible patches, small decoder);
- :mod:`.patches`: patchify and the per-patch targets, pure functions;
- :mod:`vitkit.selfsup.objective_config`: the objectives' settings.

The encoder is always an ordinary :class:`vitkit.models.vit.VisionTransformer`; an objective module
holds only its own weights (mask embedding, prediction head, decoder). :func:`build_objective`
makes one; the trainer (``vitkit.train.pretrain``) runs it.
"""

from __future__ import annotations

from typing import Any

from vitkit.registry.model_config import ViTConfig
from vitkit.selfsup.mae import MaskedAutoencoder, encode_visible, random_masking
from vitkit.selfsup.mpp import (
    Corruption,
    MaskedPatchPrediction,
    apply_corruption,
    corruption_plan,
)
from vitkit.selfsup.objective_config import OBJECTIVES, MAEConfig, MPPConfig, objective_config
from vitkit.selfsup.patches import (
    downsized_target,
    mean_color_target,
    patchify,
    quantize,
    unpatchify,
)

__all__ = [
    "OBJECTIVES",
    "Corruption",
    "MAEConfig",
    "MPPConfig",
    "MaskedAutoencoder",
    "MaskedPatchPrediction",
    "apply_corruption",
    "build_objective",
    "corruption_plan",
    "downsized_target",
    "encode_visible",
    "mean_color_target",
    "objective_config",
    "patchify",
    "quantize",
    "random_masking",
    "unpatchify",
]


def build_objective(
    name: str, options: dict[str, Any], encoder_cfg: ViTConfig
) -> MaskedPatchPrediction | MaskedAutoencoder:
    """The objective ``name`` ("mpp" or "mae") for an encoder of config ``encoder_cfg``."""
    cfg = objective_config(name, options)
    if isinstance(cfg, MPPConfig):
        return MaskedPatchPrediction(cfg, encoder_cfg)
    return MaskedAutoencoder(cfg, encoder_cfg)
