"""Settings of the self-supervised objectives: one frozen dataclass per objective.

A :class:`vitkit.train.trainer.TrainConfig` names the objective (``objective="mpp"``) and
overrides its fields with ``objective_options`` (as ``model_overrides`` does for the model);
:func:`objective_config` checks the names and builds the dataclass.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal

from vitkit.errors import VitkitError
from vitkit.registry.model_config import check_fields

MPPTarget = Literal["mean-color", "downsized", "pixels"]
OBJECTIVES: tuple[str, ...] = ("mpp", "mae")


@dataclass(frozen=True)
class MPPConfig:
    """Masked patch prediction (the paper's Appendix B.1.2)."""

    corrupt_ratio: float = 0.5  # fraction of every image's patches that are corrupted
    mask_prob: float = 0.8  # of the corrupted: replaced by the learnable [mask] embedding
    random_prob: float = 0.1  # of the corrupted: replaced by another patch's embedding
    target: MPPTarget = "mean-color"  # mean-color | downsized (grid x grid colours) | pixels (L2)
    bits: int = 3  # bits per channel of a quantised colour (3: 512 RGB colours, 8 gray levels)
    grid: int = 4  # downsized target: cells per side of the downsized patch

    def __post_init__(self) -> None:
        if not 0.0 < self.corrupt_ratio <= 1.0:
            raise VitkitError(f"corrupt_ratio must lie in (0, 1], got {self.corrupt_ratio}")
        if self.mask_prob < 0 or self.random_prob < 0 or self.mask_prob + self.random_prob > 1:
            raise VitkitError(
                f"mask_prob ({self.mask_prob}) and random_prob ({self.random_prob}) must be "
                ">= 0 and sum to at most 1 (the rest is kept unchanged)"
            )
        if self.target not in ("mean-color", "downsized", "pixels"):
            raise VitkitError(
                f"target must be mean-color, downsized or pixels, got {self.target!r}"
            )
        if not 1 <= self.bits <= 8:
            raise VitkitError(f"bits must lie in 1..8, got {self.bits}")
        if self.grid < 1:
            raise VitkitError(f"grid must be at least 1, got {self.grid}")


@dataclass(frozen=True)
class MAEConfig:
    """Masked autoencoder (He et al., 2022): the encoder sees only the visible patches, a small
    decoder reconstructs the pixels of the masked ones."""

    mask_ratio: float = 0.75  # fraction of every image's patches hidden from the encoder
    decoder_width: int = 512
    decoder_depth: int = 8
    decoder_heads: int = 16
    decoder_mlp_dim: int | None = None  # None: 4 x decoder_width
    norm_pix_loss: bool = True  # targets standardised per patch (MAE's best setting)

    def __post_init__(self) -> None:
        if not 0.0 < self.mask_ratio < 1.0:
            raise VitkitError(f"mask_ratio must lie in (0, 1), got {self.mask_ratio}")
        for name in ("decoder_width", "decoder_depth", "decoder_heads"):
            if getattr(self, name) < 1:
                raise VitkitError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.decoder_width % self.decoder_heads:
            raise VitkitError(
                f"decoder_width {self.decoder_width} is not divisible by decoder_heads "
                f"{self.decoder_heads}"
            )


def objective_config(name: str, options: dict[str, Any]) -> MPPConfig | MAEConfig:
    """The objective ``name`` ("mpp" or "mae") with ``options`` overriding its defaults."""
    cls: type[MPPConfig] | type[MAEConfig]
    if name == "mpp":
        cls = MPPConfig
    elif name == "mae":
        cls = MAEConfig
    else:
        raise VitkitError(f"unknown objective {name!r}: expected {' or '.join(OBJECTIVES)}")
    check_fields(cls, options, f"{name} option(s)")
    return cls(**options)


def objective_fields(name: str) -> list[tuple[str, Any]]:
    """(field, default) of an objective's settings, for help texts."""
    cls = MPPConfig if name == "mpp" else MAEConfig
    return [(f.name, f.default) for f in dataclasses.fields(cls)]
