"""How raw images become model input (:class:`PreprocessConfig`; ``vitkit.registry.model_config``
re-exports it), stored in every checkpoint next to the model's config."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from vitkit.errors import VitkitError
from vitkit.registry.config_checks import check_fields, check_preprocess


@dataclass(frozen=True)
class PreprocessConfig:
    """How raw images become model input; stored in every checkpoint so that evaluation and
    prediction rebuild exactly the transform the model was trained with."""

    image_size: tuple[int, int] = (224, 224)  # (height, width) fed to the model
    channels: int = 3  # 1: images are converted to grayscale; 3: to RGB
    mean: tuple[float, ...] = (0.5, 0.5, 0.5)  # per channel, on [0, 1] pixels
    std: tuple[float, ...] = (0.5, 0.5, 0.5)  # the paper's (x - 0.5) / 0.5 maps pixels to [-1, 1]
    interpolation: str = "bilinear"  # resampling filter for resizing
    crop_pct: float = 1.0  # eval: resize to size / crop_pct (as `resize` says), centre-crop size
    # "shortest_edge": the shorter side to floor(size / crop_pct), aspect kept (timm's "center",
    # Hugging Face's size.shortest_edge); "squash": both sides to floor(side / crop_pct), aspect
    # not kept (timm's "squash", Hugging Face's size.height/width); "none": no resize, only the
    # centre crop (zero-padded where the image is smaller)
    resize: str = "shortest_edge"
    rescale_factor: float = 1 / 255  # pixels 0..255 times this, then (x - mean) / std
    crop_offset: str = "floor"  # centre crop's first row/column: floor((new - size) / 2), or
    # "round" (Python's round, half to even: torchvision's CenterCrop, what timm uses)

    def __post_init__(self) -> None:
        for name, value in check_preprocess(self).items():  # every field's type and range
            object.__setattr__(self, name, value)
        if len(self.mean) != self.channels or len(self.std) != self.channels:
            raise VitkitError(
                f"mean and std need {self.channels} values, got {self.mean}, {self.std}"
            )

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d.update(image_size=list(self.image_size), mean=list(self.mean), std=list(self.std))
        return d

    def replace(self, **changes: Any) -> PreprocessConfig:
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> PreprocessConfig:
        check_fields(cls, d, "preprocessing fields")
        return cls(**d)

    @classmethod
    def for_model(cls, cfg: Any, crop_pct: float = 1.0) -> PreprocessConfig:
        c = cfg.in_chans
        return cls(cfg.image_size, c, (0.5,) * c, (0.5,) * c, "bilinear", crop_pct)
