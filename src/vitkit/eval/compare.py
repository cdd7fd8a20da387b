"""A quantized model beside its fp32 source: top-1 of each, the difference, the agreement."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn


class Recorder(nn.Module):
    """``model`` unchanged, keeping the top-1 class of every row it is asked about (in order:
    evaluation reads its loader unshuffled, so two recorders' lists line up image by image)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model
        self.top1: list[Tensor] = []

    def forward(self, x: Tensor) -> Tensor:
        out = self.model(x)
        self.top1.append(out.argmax(-1).cpu())
        return out

    def predictions(self) -> Tensor:
        return torch.cat(self.top1) if self.top1 else torch.zeros(0, dtype=torch.long)


def agreement(a: Tensor, b: Tensor) -> float:
    """Fraction of images on which two models' top-1 classes are the same."""
    if a.shape != b.shape or a.numel() == 0:
        raise ValueError(f"predictions of different lengths: {a.shape} vs {b.shape}")
    return float((a == b).float().mean())


def comparison(top1: float, source_top1: float, agree: float, source: str) -> dict[str, Any]:
    """The record eval.json keeps (percentages): this model's top-1, the source's, the
    difference (this - source) and the top-1 agreement."""
    return {
        "source": source,
        "top1": 100 * top1,
        "source_top1": 100 * source_top1,
        "top1_difference": 100 * (top1 - source_top1),
        "top1_agreement": 100 * agree,
    }


def format_comparison(c: dict[str, Any], precision: str, reference: str = "fp32 source") -> str:
    return (
        f"{precision} vs {reference} ({c['source']}): top-1 {c['top1']:.2f} % vs "
        f"{c['source_top1']:.2f} % ({c['top1_difference']:+.2f} points), "
        f"top-1 agreement {c['top1_agreement']:.2f} %"
    )


def versus_fp32(
    recorded: Any,
    fp32: Any,
    ckpt: Any,
    dataset: Any,
    batch_size: int,
    result: Any = None,
    *,
    device: str = "cpu",
    max_seq_len: int | None = None,
) -> dict[str, Any]:
    """A lower-precision model (a Recorder, or a module) beside the reference ``fp32`` (fp32;
    bf16 for fp8) on the same images, prepared on ``device``: top-1 of each, the difference and
    the agreement. ``max_seq_len``: a NaFlex model's packed batches. (The reference is what
    :mod:`vitkit.engines.checkpoint_runner` says a precision is measured against.)"""
    from vitkit.eval.checkpoint_eval import evaluate_checkpoint

    kw: dict[str, Any] = {"batch_size": batch_size, "progress": False, "device": device}
    kw["max_seq_len"] = max_seq_len
    if not isinstance(recorded, Recorder):
        recorded = Recorder(recorded)
    if result is None:
        result = evaluate_checkpoint(recorded, ckpt, dataset, **kw)
    ref = Recorder(fp32)
    base = evaluate_checkpoint(ref, ckpt, dataset, **kw)
    agree = agreement(recorded.predictions(), ref.predictions())
    return comparison(result.metrics()["top1"], base.metrics()["top1"], agree, str(ckpt.path))


def versus_source(
    recorded: Recorder,
    fp32: nn.Module,
    src: Any,
    source: str,
    dataset: Any,
    batch_size: int,
    result: Any,
    max_seq_len: int | None = None,
) -> dict[str, Any]:
    """An engine directory's model (``recorded``, evaluated into ``result``) beside its fp32
    source ``fp32`` (checkpoint ``src``, at path ``source``) on the same images, packed to
    ``max_seq_len`` patches as the engine's were (a NaFlex model)."""
    from vitkit.eval.checkpoint_eval import evaluate_checkpoint

    rec = Recorder(fp32)
    ref = evaluate_checkpoint(
        rec, src, dataset, batch_size=batch_size, progress=False, max_seq_len=max_seq_len
    )
    agree = agreement(recorded.predictions(), rec.predictions())
    return comparison(result.metrics()["top1"], ref.metrics()["top1"], agree, source)


__all__ = [
    "Recorder",
    "agreement",
    "comparison",
    "format_comparison",
    "versus_fp32",
    "versus_source",
]
