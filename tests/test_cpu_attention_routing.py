"""Which kernel eager CPU attention runs: plain matmuls + softmax, or PyTorch's fused kernel.

Training (gradients on) takes plain matmuls in bf16 and on short sequences over many rows (the
fused kernel's backward is slow there); inference takes the fused kernel except in bf16 over
many rows, and in fp32 where the CPU lacks AVX-512 (plain matmuls copy the strided k and v
first; bench/results/speed_inference.md).
Checked by the operators the profiler sees, and the two paths agree."""

from __future__ import annotations

import pytest
import torch

import vitkit
from vitkit.models.cpu_attention import EXPLICIT_CPU_MIN_ROWS, plain_cpu_attention


def test_the_rule_for_training_and_inference():
    many, few = EXPLICIT_CPU_MIN_ROWS, EXPLICIT_CPU_MIN_ROWS - 1
    # training: bf16 always, fp32 on short sequences over many rows
    assert plain_cpu_attention(few, 197, bf16=True, grad=True)
    assert plain_cpu_attention(many, 17, grad=True) and not plain_cpu_attention(few, 17)
    assert not plain_cpu_attention(many, 197, grad=True)
    # inference: bf16 over many rows; fp32 as training does only without AVX-512
    assert plain_cpu_attention(many, 17, bf16=True, grad=False)
    assert not plain_cpu_attention(few, 17, bf16=True, grad=False)
    assert not plain_cpu_attention(many, 17, grad=False, avx512=True)
    assert plain_cpu_attention(many, 17, grad=False, avx512=False)
    assert not plain_cpu_attention(few, 17, grad=False, avx512=False)
    assert not plain_cpu_attention(many, 197, grad=False, avx512=False)


def kernels(model: torch.nn.Module, x: torch.Tensor, grad: bool) -> set[str]:
    with torch.set_grad_enabled(grad), torch.profiler.profile() as prof:
        model(x)
    return {e.key for e in prof.key_averages()}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("batch", [1, 64])
def test_the_model_runs_the_kernel_the_rule_picks_and_both_agree(dtype, batch):
    torch.manual_seed(0)
    model = vitkit.create_model(
        "Ti/4", image_size=16, in_chans=1, num_classes=3, width=32, depth=1, num_heads=2,
        mlp_dim=64,
    ).to(dtype)  # fmt: skip
    x = torch.randn(batch, 1, 16, 16, dtype=dtype)  # 17 tokens over batch x 2 heads
    bf16 = dtype == torch.bfloat16
    for grad in (True, False):
        plain = plain_cpu_attention(2 * batch, 17, bf16=bf16, grad=grad)
        ops = kernels(model, x, grad)
        fused = any("scaled_dot_product" in op for op in ops)
        assert fused != plain and ("aten::bmm" in ops) == plain, (grad, sorted(ops))
    with torch.no_grad():
        inference = model(x)
    training = model(x).detach()
    tol = 2e-2 if bf16 else 1e-5
    assert torch.allclose(inference.float(), training.float(), atol=tol, rtol=tol)
