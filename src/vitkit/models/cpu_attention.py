"""Which kernel eager CPU attention runs: softmax(q k^T) v with plain matmuls, or PyTorch's fused
``scaled_dot_product_attention``; measured by bench/cpu_attention.py (the attention alone and
whole training steps) and bench/speed.py (whole models' inference)."""

from __future__ import annotations

import functools

import torch

# Eager CPU attention computes softmax(q k^T) v with plain matmuls for short sequences over many
# (batch x head) rows. fp32, 2 threads, AVX2 EPYC, fused / explicit time over several runs,
# inference | training: [128, 4, 17, 16] 1.7-1.9 | 2.3-2.9x, [128, 4, 50, 16] 1.3-1.6 | 1.5-1.6x,
# [64, 3, 65, 64] 1.1-1.5 | 1.2-1.4x; but [32, 3, 197, 64] 0.9-1.0 | 0.9x, [32, 12, 197, 64]
# 0.5 | 0.6-0.7x, and with few rows ([1, 4, 50, 16] 0.3-0.8x) the one fused call wins; 64 rows is
# about even (bench/results/cpu_attention.md).
EXPLICIT_CPU_MAX_TOKENS = 128
EXPLICIT_CPU_MIN_ROWS = 64


# Inference: plain matmuls copy the strided k and v first (the fused kernel reads them as they
# are). With AVX-512 the fused kernel then wins at every fp32 shape measured (the MNIST model at
# batch 256, 2 threads, AMD EPYC Zen 4: 0.72x timm plain, 1.04x fused); on an AVX2-only EPYC
# plain matmuls ran it at 1.46x timm (bench/results/speed_mnist_fp32.md). In bf16 plain matmuls
# win over many rows and lose over few (the MNIST model at batch 1: 0.85x / 1.14x).


def plain_cpu_attention(
    rows: int, tokens: int, *, bf16: bool = False, grad: bool = True, avx512: bool | None = None
) -> bool:
    """Whether eager CPU attention over ``rows`` (batch x heads) of ``tokens`` takes plain
    matmuls: training (``grad``) in bf16 or on short sequences over many rows; inference in
    bf16 over many rows, or in fp32 as training does where the CPU lacks AVX-512 (``avx512``:
    this machine's, where not given)."""
    avx512 = avx512_kernels() if avx512 is None else avx512
    return plain_attention_rule(rows, tokens, bf16, grad, avx512)


def plain_attention_rule(
    rows: int,
    tokens: int,
    bf16: bool,
    grad: bool,
    avx512: bool,
    min_rows: int = EXPLICIT_CPU_MIN_ROWS,  # (arguments: TorchScript reads no global)
    max_tokens: int = EXPLICIT_CPU_MAX_TOKENS,
) -> bool:
    """:func:`plain_cpu_attention` with every input given; TorchScript compiles it, so that a
    scripted model (:mod:`vitkit.models.scriptable`) picks the kernel the eager one picks."""
    many = rows >= min_rows
    short = tokens <= max_tokens and many
    if grad:
        return bf16 or short
    if bf16:
        return many
    return short and not avx512


@functools.cache
def avx512_kernels() -> bool:
    """Whether PyTorch's CPU kernels run at AVX-512 here (asked once: every layer asks)."""
    return torch.backends.cpu.get_cpu_capability().startswith("AVX512")


__all__ = [
    "EXPLICIT_CPU_MAX_TOKENS",
    "EXPLICIT_CPU_MIN_ROWS",
    "avx512_kernels",
    "plain_attention_rule",
    "plain_cpu_attention",
]
