"""``vitkit.create_model`` as timm's ``create_model``: a fresh model, or with
``pretrained=True, pretrained_cfg_overlay=dict(file=PATH)`` or ``checkpoint_path=PATH`` the
weights at PATH loaded under the name (``vitkit.load(PATH, arch=name, ...)``: a bare timm
state dict read as that entry, at the input size its position embeddings fill, then moved to
``img_size`` / ``num_classes`` where given). The keywords are timm's or vitkit's
(:mod:`vitkit.registry.timm_keywords`). vitkit never downloads.

Where it differs from timm, on purpose: a new head (``num_classes`` other than the weights')
starts at zero, the paper's fine-tuning rule; ``head_init="timm"`` draws it as timm does.
``checkpoint_path`` at another ``img_size`` resamples the position embeddings (timm's
``load_checkpoint`` refuses the shapes; its ``pretrained=True`` path resamples them too).
"""

from __future__ import annotations

from typing import Any

from torch import nn

from vitkit.checkpoints.arch import entries
from vitkit.checkpoints.formats import load
from vitkit.models import vit
from vitkit.registry.model_config import ModelConfig
from vitkit.registry.timm_keywords import from_timm


def create_model(name: str | ModelConfig, **overrides: Any) -> nn.Module:
    """A model by name (vitkit's ``"B/16"``, timm's ``"vit_base_patch16_224"``, the family's
    names) or config, fresh (:func:`vitkit.models.vit.create_model`) or with the weights that
    ``checkpoint_path`` / ``pretrained_cfg_overlay["file"]`` name (see the module)."""
    overrides = from_timm(overrides)
    path = overrides.pop("checkpoint_path", None)
    if path is None:
        return vit.create_model(name, **overrides)
    arch = name.split(".")[0] if isinstance(name, str) and name.split(".")[0] in entries() else None
    return load(path, **({"arch": arch} if arch else {}), **overrides)
