"""bench/fp8_accuracy.py's verdict: float8 judged against the bf16 seeds' own spread."""

from __future__ import annotations

import pytest
from references import load_bench


@pytest.fixture(scope="module")
def bench():
    return load_bench("fp8_accuracy")


def curve(offset: float, steps: int = 5) -> list[tuple[int, float]]:
    return [(10 * (i + 1), 2.0 / (i + 1) + offset) for i in range(steps)]


def test_runs_pair_each_fp8_seed_with_a_bf16_seed(bench):
    assert bench.runs(3) == [
        ("bf16", 0), ("bf16", 1), ("bf16", 2), ("fp8", 0), ("fp8", 1), ("fp8", 2)
    ]  # fmt: skip


def test_float8_close_to_its_pairs_is_within(bench):
    curves = {"bf16_seed0": curve(0), "bf16_seed1": curve(0.05), "bf16_seed2": curve(-0.03)}
    curves |= {"fp8_seed0": curve(0.01), "fp8_seed1": curve(0.06), "fp8_seed2": curve(-0.02)}
    top1 = {"bf16_seed0": 0.98, "bf16_seed1": 0.975, "bf16_seed2": 0.985}
    top1 |= {"fp8_seed0": 0.979, "fp8_seed1": 0.976, "fp8_seed2": 0.983}
    v = bench.verdict(curves, top1)
    assert v["seeds"] == 3
    # seeds' pairs: |0-0.05|, |0+0.03|, |0.05+0.03| -> mean 0.16/3
    assert v["loss_gap_bf16_seeds"] == pytest.approx(0.16 / 3)
    assert v["loss_gap_fp8_vs_bf16"] == pytest.approx(0.01)
    assert v["top1_range_bf16_seeds"] == pytest.approx(0.01)
    assert v["top1_gap_fp8_vs_bf16"] == pytest.approx(abs(2.938 - 2.94) / 3)
    assert v["loss_within_seed_spread"] and v["top1_within_seed_spread"]


def test_float8_that_drifts_is_outside(bench):
    curves = {"bf16_seed0": curve(0), "bf16_seed1": curve(0.02)}
    curves |= {"fp8_seed0": curve(0.1), "fp8_seed1": curve(0.12)}
    top1 = {"bf16_seed0": 0.98, "bf16_seed1": 0.978, "fp8_seed0": 0.95, "fp8_seed1": 0.96}
    v = bench.verdict(curves, top1)
    assert v["loss_gap_fp8_vs_bf16"] == pytest.approx(0.1)
    assert not v["loss_within_seed_spread"]
    assert not v["top1_within_seed_spread"]


def test_one_bf16_seed_is_no_yardstick(bench):
    with pytest.raises(ValueError, match="two bf16 seeds"):
        bench.verdict({"bf16_seed0": curve(0), "fp8_seed0": curve(0)}, {})
    with pytest.raises(ValueError, match="no fp8 run"):
        bench.verdict({"bf16_seed0": curve(0), "bf16_seed1": curve(0)}, {})


def test_runs_with_no_common_step_are_refused(bench):
    with pytest.raises(ValueError, match="no step in common"):
        bench.mean_gap([(1, 1.0)], [(2, 1.0)])
