"""Precision "auto": bf16 autocast only where the device multiplies bf16 natively. On a CPU
without AVX512-BF16 / AMX, bf16 matmuls are emulated and many times slower than fp32, so the
recipes' "auto" must train in fp32 there (and in bf16 where it is native)."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
import torch

from vitkit.errors import VitkitError
from vitkit.hardware import native_bf16, resolve_precision
from vitkit.train.recipes import RECIPES
from vitkit.train.trainer import TrainConfig, Trainer

CPU = torch.device("cpu")
NATIVE = native_bf16(CPU)


def test_auto_is_bf16_exactly_where_native() -> None:
    assert resolve_precision("auto", CPU) == ("bf16" if NATIVE else "fp32")
    assert resolve_precision("fp32", CPU) == "fp32"
    assert resolve_precision("auto", torch.device("meta")) == "fp32"  # nothing native there


def test_explicit_bf16_is_kept_and_warned_about_where_emulated() -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert resolve_precision("bf16", CPU) == "bf16"
    emulated = [w for w in caught if "emulated" in str(w.message)]
    assert len(emulated) == (0 if NATIVE else 1)


def test_unknown_precision_is_refused() -> None:
    with pytest.raises(VitkitError, match="precision must be"):
        resolve_precision("fp16", CPU)
    with pytest.raises(VitkitError, match="precision must be"):
        TrainConfig(precision="fp16")  # type: ignore[arg-type]


def test_the_recipes_pick_auto() -> None:
    assert RECIPES["mnist"].config.precision == "auto"


def test_a_run_records_the_precision_auto_resolved_to(tmp_path: Path) -> None:
    out = tmp_path / "run"
    cfg = TrainConfig(
        data="digits",
        model="Ti/2",
        model_overrides={"width": 32, "depth": 1, "num_heads": 2, "mlp_dim": 64},
        batch_size=32,
        max_steps=1,
        augment="none",
        precision="auto",
        progress=False,
        out_dir=str(out),
    )
    trainer = Trainer(cfg)
    want = "bf16" if NATIVE else "fp32"
    assert trainer.cfg.precision == want
    trainer.fit()
    saved = json.loads((out / "train_config.json").read_text())
    assert saved["precision"] == want  # what resuming and 'vitkit eval' read back


def test_cpu_name_says_the_vector_extensions_lscpu_shows():
    """Benchmarks name the CPU with what decides their speed (AVX2 only vs AVX-512 / AMX)."""
    import subprocess

    from vitkit.hardware import cpu_name

    name = cpu_name()
    try:
        flags = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    except OSError:
        pytest.skip("no lscpu here")
    assert "vCPUs" in name and ("avx2" in name) == (" avx2 " in flags + " ")
    assert ("avx512f" in name) == (" avx512f " in flags + " ")


def test_cpu_name_says_family_model_and_amx_or_not():
    """A speed figure names the CPU kind: vendor and model, family/model and whether it has AMX
    (bf16 7-10x fp32 with AMX, about 2x without)."""
    from vitkit.hardware import describe_lscpu

    zen4 = (
        "Vendor ID:   AuthenticAMD\nModel name:   AMD EPYC 9R14\nCPU family:   25\nModel:   17\n"
        "Flags:   fpu avx2 avx512f avx512_vnni avx512_bf16\n"
    )
    spr = (
        "Vendor ID:   GenuineIntel\nModel name:   Intel(R) Xeon(R) Platinum 8488C\n"
        "CPU family:   6\nModel:   143\nFlags:   avx2 avx512f avx512_bf16 amx_bf16 amx_int8\n"
    )
    assert describe_lscpu(zen4, 2) == (
        "AMD EPYC 9R14, family 25 model 17 (2 vCPUs; avx2, avx512f, avx512_vnni, avx512_bf16; "
        "no AMX)"
    )
    named = describe_lscpu(spr, 16)
    assert named.startswith("Intel(R) Xeon(R) Platinum 8488C, family 6 model 143 (16 vCPUs;")
    assert "amx_bf16, amx_int8)" in named and "no AMX" not in named
