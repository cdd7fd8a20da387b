"""The host's bf16 matmul ceiling: the fastest rate any installed library multiplies bf16 at.

A square ``torch.mm`` (bench/speed.py's ``matmul_ceiling``) reorders both operands into
oneDNN's blocked layout on every call; an inference engine multiplies by weights packed once.
On a 2-vCPU AMD EPYC with AVX512-BF16 OpenVINO ran a whole B/16 forward at more FLOP/s than
``torch.mm`` reached, so a fraction "of the ceiling" against ``torch.mm`` alone said over 100 %.
The ceiling here is the best of three products of the same size, each the best of ``reps``:
``torch.mm``, oneDNN with the weight packed once (``torch.ops.mkldnn._reorder_linear_weight``),
and OpenVINO's CPU plugin at its bf16 inference precision with the weight a constant.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np
import torch


def _best(fn: Callable[[], object], reps: int) -> float:
    fn()
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def bf16_ceilings(m: int = 4096, n: int = 2048, reps: int = 5) -> dict[str, float]:
    """FLOP/s of an (m x n) @ (n x n) bf16 product by each library installed, and their best
    (``"bf16"``)."""
    flops = 2 * m * n * n
    x, w = torch.randn(m, n).bfloat16(), torch.randn(n, n).bfloat16()
    out = {"bf16 torch.mm": flops / _best(lambda: x @ w, reps)}
    with torch.inference_mode():
        try:
            packed = torch.ops.mkldnn._reorder_linear_weight(w, m)
            run = lambda: torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")  # noqa: E731
            out["bf16 oneDNN packed"] = flops / _best(run, reps)
        except (AttributeError, RuntimeError):
            pass
    try:
        import openvino as ov
        import openvino.opset13 as ops
    except ImportError:
        ov = None
    if ov is not None:
        p = ops.parameter([m, n], np.float32)
        const = ops.constant(np.random.default_rng(0).standard_normal((n, n), dtype=np.float32))
        model = ov.Model([ops.matmul(p, const, False, False)], [p])
        config = {
            "INFERENCE_PRECISION_HINT": "bf16",
            "INFERENCE_NUM_THREADS": torch.get_num_threads(),
            "PERFORMANCE_HINT": "LATENCY",
        }
        request = ov.Core().compile_model(model, "CPU", config).create_infer_request()
        feed = {0: np.random.default_rng(1).standard_normal((m, n), dtype=np.float32)}
        out["bf16 OpenVINO"] = flops / _best(lambda: request.infer(feed), reps)
    out["bf16"] = max(out.values())
    return out


if __name__ == "__main__":
    print({k: f"{v / 1e9:.0f} GFLOP/s" for k, v in bf16_ceilings().items()})
