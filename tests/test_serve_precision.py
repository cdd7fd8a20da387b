"""vitkit serve --precision auto (the default): bf16 where the CPU multiplies bf16 natively and
the model's bf16 top-1 agrees with its fp32 top-1 measured at start, fp32 elsewhere; the ready
line and /v1/info say which and why."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

pytest.importorskip("fastapi", reason="the serve extra is not installed (pip install '.[serve]')")

from test_serve_bounds import call  # noqa: E402
from test_serve_bounds import work as work  # noqa: E402,F401  (the module's fixture)
from test_serve_decode_process import Server  # noqa: E402

import vitkit  # noqa: E402
from vitkit.cli import build_parser, main  # noqa: E402
from vitkit.engines.auto_precision import IMAGES, synthetic_images  # noqa: E402
from vitkit.hardware import native_bf16  # noqa: E402

NATIVE = native_bf16(torch.device("cpu"))


def precision_line(out: str) -> str:
    (line,) = [x for x in out.splitlines() if x.startswith("precision: ")]
    return line


def test_auto_is_the_default_and_says_its_choice(work: Path, capsys) -> None:
    assert build_parser().parse_args(["serve", "x"]).precision == "auto"
    assert main(["serve", str(work / "ck"), "--dry-run"]) == 0
    line = precision_line(capsys.readouterr().out)
    if NATIVE:  # bf16, or fp32 where this model's bf16 answers differ
        assert line.startswith("precision: bf16 (auto: bf16, native on this CPU, top-1 agreeing")
        assert f"of {IMAGES} synthetic images measured at start" in line
    else:
        assert (
            line == "precision: fp32 (auto: fp32, this CPU has no native bf16 (AVX512-BF16 or AMX))"
        )


def test_auto_runs_fp32_on_a_cpu_without_native_bf16(work: Path, capsys, monkeypatch) -> None:
    import vitkit.hardware

    monkeypatch.setattr(vitkit.hardware, "native_bf16", lambda device: False)
    assert main(["serve", str(work / "ck"), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert precision_line(out).startswith("precision: fp32 (auto: fp32, this CPU has no native")
    assert "engine: torch, fp32" in out


@pytest.mark.skipif(not NATIVE, reason="this CPU has no native bf16")
def test_auto_falls_back_to_fp32_where_bf16_changes_the_answers(tmp_path: Path, capsys) -> None:
    """A head whose logits differ by less than bf16 resolves: bf16's top-1 differs from fp32's
    on many images, and the server runs fp32, saying so."""
    torch.manual_seed(0)
    model = vitkit.create_model("Ti/4", num_classes=50, image_size=16, in_chans=3, width=32,
                                depth=1, num_heads=2, mlp_dim=64)  # fmt: skip
    with torch.no_grad():
        model.head.weight.mul_(1e-3)
        model.head.bias.copy_(torch.linspace(0, 1e-5, 50) + 100)  # (logits near 100: ties)
    vitkit.save_checkpoint(tmp_path / "ck", model, class_names=[str(i) for i in range(50)])
    assert main(["serve", str(tmp_path / "ck"), "--dry-run"]) == 0
    line = precision_line(capsys.readouterr().out)
    assert line.startswith("precision: fp32 (auto: fp32, the bf16 top-1 agreed with fp32's on only")


def test_v1_info_says_the_precision_and_why(work: Path) -> None:
    server = Server([str(work / "ck"), "--precision", "auto"])
    try:
        status, body = call(server.port, "/v1/info")
        info = json.loads(body)
        assert status == 200 and info["precision"] in ("bf16", "fp32")
        assert info["precision_why"].startswith(f"auto: {info['precision']}")
        _, health = call(server.port, "/health")
        assert json.loads(health)["precision"] == info["precision"]
    finally:
        server.stop()
    server = Server([str(work / "ck"), "--precision", "fp32"])
    try:
        info = json.loads(call(server.port, "/v1/info")[1])
        assert info["precision"] == "fp32" and info["precision_why"] == "--precision fp32"
    finally:
        server.stop()


def test_the_synthetic_images_are_the_same_every_time() -> None:
    a, b = synthetic_images(3, 16, 24), synthetic_images(3, 16, 24)
    assert a.shape == (IMAGES, 3, 16, 24) and a.dtype == torch.uint8
    assert torch.equal(a, b) and a.float().std() > 10  # (not flat)
