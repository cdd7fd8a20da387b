"""vitkit: the Vision Transformer of "An Image is Worth 16x16 Words", paper-faithful and fast."""

from __future__ import annotations

from typing import Any

from vitkit.config import SIZES, STANDARD_MODELS, ViTConfig, model_config
from vitkit.errors import VitkitError
from vitkit.model import VisionTransformer

__version__ = "0.1.0"


def create_model(name: str | ViTConfig, **overrides: Any) -> VisionTransformer:
    """Build a freshly initialised ViT: ``create_model("B/16")``, ``create_model("vit_s16",
    num_classes=10, image_size=(96, 128))``, or from a :class:`ViTConfig`."""
    if isinstance(name, ViTConfig):
        return VisionTransformer(name.replace(**overrides))
    return VisionTransformer(model_config(name, **overrides))


__all__ = [
    "SIZES",
    "STANDARD_MODELS",
    "ViTConfig",
    "VisionTransformer",
    "VitkitError",
    "create_model",
    "model_config",
]
