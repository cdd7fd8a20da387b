"""The backbone for dense tasks as an exported model: ``vitkit export --features``.

:class:`FeatureOutputs` is a ViT's ``forward_intermediates`` (:mod:`vitkit.models.features`,
timm's arguments) as a module with one tensor per output, which ONNX, OpenVINO and torch.export
name: ``block{i}`` for block ``i``'s patch features ([B, D, h, w] with ``output_fmt="NCHW"``,
[B, h*w, D] with ``"NLC"``) and, with ``prefix_tokens``, ``block{i}_prefix`` ([B, prefix, D]:
the class token, registers). ``norm``: through the final norm, as timm's ``norm=True``. The
blocks after the last one asked for are not run (``stop_early``: the same features).
"""

from __future__ import annotations

from typing import Any

from torch import Tensor, nn

from vitkit.errors import VitkitError
from vitkit.models.features import FORMATS, take_indices


class FeatureOutputs(nn.Module):
    """``forward(x [B, C, H, W]) -> tuple`` of the chosen blocks' features (``names`` says
    which is which)."""

    def __init__(
        self,
        model: nn.Module,
        indices: int | list[int] | None = None,
        output_fmt: str = "NCHW",
        norm: bool = False,
        prefix_tokens: bool = False,
    ) -> None:
        super().__init__()
        if not hasattr(model, "forward_intermediates") or not hasattr(model, "blocks"):
            raise VitkitError("--features: the model is not a ViT (a BiT ResNet has no blocks)")
        if output_fmt not in FORMATS:
            raise VitkitError(f"--output-fmt must be NCHW or NLC, not {output_fmt!r}")
        self.model = model
        cfg: Any = model.cfg
        self.cfg = cfg
        self.indices, _ = take_indices(len(model.blocks), indices)  # type: ignore[arg-type]
        self.output_fmt = output_fmt
        self.norm = norm
        self.prefix_tokens = prefix_tokens and cfg.num_prefix_tokens > 0
        if prefix_tokens and not self.prefix_tokens:
            raise VitkitError("--prefix-tokens: the model has no prefix tokens")

    @property
    def names(self) -> list[str]:
        names = [f"block{i}" for i in self.indices]
        if self.prefix_tokens:
            names += [f"block{i}_prefix" for i in self.indices]
        return names

    def forward(self, x: Tensor) -> tuple[Tensor, ...]:
        out = self.model.forward_intermediates(  # type: ignore[operator]
            x,
            self.indices,
            return_prefix_tokens=self.prefix_tokens,
            norm=self.norm,
            stop_early=True,
            output_fmt=self.output_fmt,
            intermediates_only=True,
        )
        if not self.prefix_tokens:
            return tuple(out)
        return tuple(o[0] for o in out) + tuple(o[1] for o in out)

    def describe(self) -> dict[str, Any]:
        return {
            "indices": self.indices,
            "output_fmt": self.output_fmt,
            "norm": self.norm,
            "prefix_tokens": self.prefix_tokens,
            "outputs": self.names,
        }


def parse_indices(text: str | None) -> int | list[int] | None:
    """``--out-indices``: ``N`` (the last N blocks), ``i,j,k`` (those blocks, negative from the
    end) or None (every block)."""
    if text is None:
        return None
    parts = [p.strip() for p in text.split(",") if p.strip()]
    try:
        values = [int(p) for p in parts]
    except ValueError:
        raise VitkitError(
            f"--out-indices {text!r}: N (the last N blocks) or block indices i,j,k"
        ) from None
    if not values:
        raise VitkitError("--out-indices: give N or i,j,k")
    return values[0] if len(values) == 1 and "," not in text else values


__all__ = ["FeatureOutputs", "parse_indices"]
