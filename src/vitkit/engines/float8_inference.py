"""Float8 inference on an NVIDIA GPU of compute capability 8.9 or newer: weights cast once.

``--precision fp8`` of ``eval``, ``predict`` and ``serve`` runs the model in bf16 on the GPU
with the large ``nn.Linear`` layers quantized by torchao's float8 weight + dynamic activation
scheme (``quantize_`` with ``Float8DynamicActivationFloat8WeightConfig``): each chosen layer's
weight is cast to float8 (e4m3) once, when the model is loaded, and each call casts its input
to float8 with a scale computed from that input, multiplies in float8 and accumulates in higher
precision. Which layers, on which devices, and the scalings ``tensorwise`` (one scale per
tensor) and ``rowwise`` (one per row) are training's (:mod:`vitkit.float8_layers`); the other
layers (the patch embedding, the norms, the attention projection and the head by default) and
everything between the matmuls stay bf16. Anywhere but such a GPU it is refused in one line.

The model is not compiled here (a compiled graph per batch size is a long first call for
``eval`` and ``predict`` and many graphs for a server's changing batches); uncompiled, the
activations' casts are separate kernels around each matmul. ``bench/speed.py`` times the
compiled path (``vitkit+fp8infer``). ``vitkit eval --precision fp8`` records top-1 beside the
same model's in bf16 on the same images, and their agreement.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from vitkit.errors import VitkitError
from vitkit.float8_layers import (
    FP8_MIN_PARAMS,
    check_fp8_device,
    check_fp8_settings,
    fp8_layer_names,
)


def torchao_quantization() -> Any:
    """torchao's quantization module, or a one-line refusal naming the extra."""
    try:
        import torchao.quantization as quantization
    except ImportError:
        raise VitkitError(
            "--precision fp8 uses torchao's float8 inference: pip install '.[fp8]' "
            "in vitkit's clone"
        ) from None
    return quantization


def quantize_fp8_linears(
    model: nn.Module, recipe: str = "tensorwise", min_params: int = FP8_MIN_PARAMS
) -> list[str]:
    """Cast the weights of the Linear layers of ``model`` (bf16, on its device; in place) that
    take float8 to float8, once, with float8 dynamic activation scaling per ``recipe``; returns
    their names. torchao refuses the cast on a device without float8 matmuls."""
    check_fp8_settings(recipe, min_params)
    chosen = fp8_layer_names(model, min_params)
    if chosen:
        q = torchao_quantization()
        granularity = q.PerTensor() if recipe == "tensorwise" else q.PerRow()
        # set_inductor_config=False: torchao would otherwise change inductor's settings for
        # the whole process (this model is not compiled here; a caller that compiles chooses)
        config = q.Float8DynamicActivationFloat8WeightConfig(
            granularity=granularity, set_inductor_config=False
        )
        wanted = set(chosen)
        q.quantize_(model, config, filter_fn=lambda m, fqn: fqn in wanted)
    return chosen


class GPUModel(nn.Module):
    """``model`` with bf16 weights on a GPU (``precision="fp8"``: some of them float8):
    ``forward(x) -> logits fp32`` on ``x``'s device, ``x`` moved to the GPU and cast to bf16 on
    the way in (a NaFlex packed batch: its pixel values), autocast off inside (a caller's
    autocast would cast around the float8 weights). ``engine``, ``precision``,
    ``device``, ``recipe`` and ``float8_layers`` say what runs it."""

    def __init__(
        self,
        model: nn.Module,
        device: torch.device,
        precision: str = "bf16",
        recipe: str | None = None,
        float8_layers: list[str] | None = None,
    ) -> None:
        super().__init__()
        self.model = model
        self.device = device
        self.engine = "torch"
        self.precision = precision
        self.recipe = recipe
        self.float8_layers = list(float8_layers or [])

    def forward(self, x: Tensor | dict[str, Tensor]) -> Tensor:
        if isinstance(x, dict):
            home = next(iter(x.values())).device
            x = {k: self._in(v) for k, v in x.items()}
        else:
            home = x.device
            x = self._in(x)
        with torch.autocast(self.device.type, enabled=False):  # its own precision, always
            return self.model(x).float().to(home)

    def _in(self, t: Tensor) -> Tensor:
        t = t.to(self.device, non_blocking=True)
        return t.to(torch.bfloat16) if t.is_floating_point() else t

    def summary(self) -> str:
        """``tensorwise: 36 Linear layers in float8, the rest bf16, on cuda:0`` (fp8), or
        ``bf16 weights on cuda:0``."""
        if self.precision != "fp8":
            return f"bf16 weights on {self.device}"
        n = len(self.float8_layers)
        return (
            f"{self.recipe}: {n:,} Linear layer{'' if n == 1 else 's'} in float8, the rest "
            f"bf16, on {self.device}"
        )

    def extra_repr(self) -> str:
        return f"engine=torch, precision={self.precision}, device={self.device}"


def _gpu(device: torch.device | str) -> torch.device:
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return device


def fp8_model(
    model: nn.Module,
    device: torch.device | str = "cuda",
    recipe: str = "tensorwise",
    min_params: int = FP8_MIN_PARAMS,
) -> GPUModel:
    """``model`` (fp32, in place) in bf16 on ``device`` with its large Linear layers' weights
    cast to float8 once (:func:`quantize_fp8_linears`), in eval mode. Refused in one line on
    anything but an NVIDIA GPU of compute capability 8.9 or newer, before the weights move."""
    check_fp8_settings(recipe, min_params)
    device = torch.device(device)
    check_fp8_device(device)
    device = _gpu(device)
    torchao_quantization()  # the missing extra before the weights move
    model = model.to(device=device, dtype=torch.bfloat16).eval()
    with torch.cuda.device(device):  # (torchao checks the capability of the current GPU)
        layers = quantize_fp8_linears(model, recipe, min_params)
    return GPUModel(model, device, "fp8", recipe, layers)


def bf16_gpu_model(model: nn.Module, device: torch.device | str) -> GPUModel:
    """``model`` (fp32, in place) with bf16 weights on ``device``, in eval mode: what
    :func:`fp8_model` runs with no float8 layers (the reference fp8 is measured against)."""
    device = _gpu(device)
    return GPUModel(model.to(device=device, dtype=torch.bfloat16).eval(), device, "bf16")


__all__ = [
    "GPUModel",
    "bf16_gpu_model",
    "fp8_model",
    "quantize_fp8_linears",
    "torchao_quantization",
]
