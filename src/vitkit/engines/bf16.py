"""bf16 CPU inference: the model's weights converted to bf16 once, not cast per call.

On a CPU that multiplies bf16 natively (AVX512-BF16, AMX) oneDNN's bf16 matmuls run several
times faster than fp32 ones (bench/results/cpu_inference.md: the bf16 and fp32 ceilings of the
host, measured in the same run). ``torch.autocast`` casts every weight to bf16 on every call;
:func:`bf16_model` converts the weights once and runs the whole forward in bf16 (LayerNorm and
softmax accumulate in fp32 inside PyTorch's CPU kernels), returning fp32 logits, with the
Linear layers called on oneDNN directly and each MLP's fc1 + GELU one oneDNN call
(vitkit.engines.onednn). Optionally compiled by inductor (``compiled=True``); on a 2-vCPU AMD
EPYC (AVX512-BF16) compiling B/16 took over a minute and was not faster at batch 32
(bench/results/cpu_inference_bf16.md), so the command line does not compile.

Where bf16 is emulated (a CPU with AVX2 only) a bf16 matmul is many times slower than fp32
(bench/results/precision.md): inference at ``precision="bf16"`` is refused there in one line
(:func:`check_bf16_cpu`), never run slowly without a word.

Accuracy: bf16 keeps 8 bits of mantissa; ``vitkit eval --precision bf16`` records its top-1
beside fp32's on the same images, and their agreement.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from vitkit.errors import VitkitError

INFERENCE_PRECISIONS = ("fp32", "bf16")


def bf16_refusal(native: bool, cpu: str) -> str | None:
    """Why bf16 inference is refused on ``cpu`` (None where ``native``)."""
    if native:
        return None
    return (
        f"--precision bf16: {cpu} has no native bf16 (AVX512-BF16 or AMX); bf16 would be "
        "emulated, many times slower than fp32: use --precision fp32"
    )


def check_bf16_cpu() -> None:
    """Refuse bf16 CPU inference where the CPU would emulate it."""
    from vitkit.hardware import cpu_name, native_bf16

    native = native_bf16(torch.device("cpu"))
    why = bf16_refusal(native, "this CPU" if native else cpu_name())
    if why is not None:
        raise VitkitError(why)


def check_precision(precision: str) -> str:
    if precision not in INFERENCE_PRECISIONS:
        raise VitkitError(
            f"inference precision must be one of {', '.join(INFERENCE_PRECISIONS)}, "
            f"got {precision!r}"
        )
    return precision


class BF16Model(nn.Module):
    """``model`` with bf16 weights: ``forward(x float) -> logits fp32`` (the input cast to
    bf16 on the way in). ``engine`` and ``precision`` say what runs it."""

    def __init__(self, model: nn.Module, compiled: bool = False) -> None:
        super().__init__()
        self.model = model
        self.engine = "torch"
        self.precision = "bf16"
        self.compiled = compiled
        self._run: Any = torch.compile(model, dynamic=False) if compiled else model

    def forward(self, x: Tensor | dict[str, Tensor]) -> Tensor:
        if isinstance(x, dict):  # a NaFlex packed batch: its pixel values in bf16
            x = {k: v.to(torch.bfloat16) if v.is_floating_point() else v for k, v in x.items()}
        elif x.is_floating_point():
            x = x.to(torch.bfloat16)
        with torch.inference_mode():
            return self._run(x).float()

    def extra_repr(self) -> str:
        return f"engine=torch{' compiled' if self.compiled else ''}, precision=bf16"


def bf16_model(model: nn.Module, compiled: bool = False) -> BF16Model:
    """``model`` (fp32, in place: its weights become bf16) as a :class:`BF16Model`, in eval
    mode. Refused on a CPU without native bf16."""
    from vitkit.engines.onednn import onednn_linears

    check_bf16_cpu()
    model = model.to(torch.bfloat16).eval()
    if not compiled:  # fc1 + GELU as one oneDNN call, Linear layers straight to oneDNN
        onednn_linears(model)
    return BF16Model(model, compiled=compiled)


__all__ = [
    "BF16Model",
    "INFERENCE_PRECISIONS",
    "bf16_model",
    "bf16_refusal",
    "check_bf16_cpu",
    "check_precision",
]
