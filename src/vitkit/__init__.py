"""vitkit: the Vision Transformer of "An Image is Worth 16x16 Words", paper-faithful and fast.

The public names are loaded on first use, so ``import vitkit`` (and ``vitkit --help``) stays
fast and the CLI can set threading options before PyTorch starts.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_EXPORTS = {
    "SIZES": "vitkit.registry.model_config",
    "STANDARD_MODELS": "vitkit.registry.model_config",
    "ViTConfig": "vitkit.registry.model_config",
    "PreprocessConfig": "vitkit.registry.model_config",
    "model_config": "vitkit.registry.model_config",
    "VitkitError": "vitkit.errors",
    "AssumptionWarning": "vitkit.errors",
    "VisionTransformer": "vitkit.models.vit",
    "create_model": "vitkit.checkpoints.timm_create",
    "load": "vitkit.checkpoints",
    "load_model": "vitkit.checkpoints",
    "load_checkpoint": "vitkit.checkpoints",
    "save_checkpoint": "vitkit.checkpoints",
}

__all__ = [
    "SIZES",
    "STANDARD_MODELS",
    "AssumptionWarning",
    "PreprocessConfig",
    "ViTConfig",
    "VisionTransformer",
    "VitkitError",
    "create_model",
    "load",
    "load_checkpoint",
    "load_model",
    "model_config",
    "save_checkpoint",
]

if TYPE_CHECKING:
    from vitkit.checkpoints import load, load_checkpoint, load_model, save_checkpoint
    from vitkit.checkpoints.timm_create import create_model
    from vitkit.errors import AssumptionWarning, VitkitError
    from vitkit.models.vit import VisionTransformer
    from vitkit.registry.model_config import (
        SIZES,
        STANDARD_MODELS,
        PreprocessConfig,
        ViTConfig,
        model_config,
    )


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'vitkit' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
