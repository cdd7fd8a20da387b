"""vitkit.engines.runner from Python: the one place that decides how a checkpoint runs gives the
model and the line that ``vitkit predict`` runs and prints (default, --engine, --fast, bf16 and an
int8 engine directory), its numbers those of the loaded model, an engine directory's fp32 source
as its reference, the refusals in one line before any weights are read, and ``import
vitkit.engines`` still importing nothing."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import numpy as np
import pytest
import torch
from PIL import Image
from references import OPENVINO

import vitkit
import vitkit.engines
from vitkit import hardware
from vitkit.cli import main
from vitkit.engines.backends import available
from vitkit.errors import VitkitError
from vitkit.hardware import native_bf16


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    d = tmp_path_factory.mktemp("runner")
    torch.manual_seed(0)
    model = vitkit.create_model(
        "Ti/8", image_size=16, num_classes=4, width=32, depth=2, num_heads=2, mlp_dim=64
    )
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    vitkit.save_checkpoint(d / "ck", model, class_names=("a", "b", "c", "d"))
    img = d / "x.png"
    Image.fromarray((np.arange(16 * 16 * 3) % 251).reshape(16, 16, 3).astype(np.uint8)).save(img)
    return d / "ck", img


def _predict_line(capsys, *args):
    """The engine line ``vitkit predict`` prints for the same choice."""
    assert main(["predict", "--from", *args]) == 0
    return capsys.readouterr().out.splitlines()[0]


def _close_to_loaded(run, ckpt_path, tol):
    x = torch.randn(3, 3, 16, 16)
    with torch.inference_mode():
        want = vitkit.load(ckpt_path)(x)
        got = run.model(x)
    assert (got.float() - want).abs().max() <= tol * max(1.0, float(want.abs().max()))


def test_the_default_runner_is_the_torch_engine_on_onednn(ckpt, capsys):
    path, img = ckpt
    run = vitkit.engines.runner(path)
    assert isinstance(run, vitkit.engines.Runner)
    assert run.line == "engine: torch, fp32 (default; Linear layers on oneDNN)"
    assert run.checkpoint.class_names == ("a", "b", "c", "d")
    _close_to_loaded(run, path, 1e-5)
    assert _predict_line(capsys, str(path), str(img), "--engine", "torch").startswith(
        "engine: torch, fp32 (as asked"
    )


@pytest.mark.parametrize("engine", ["onnxruntime", pytest.param("openvino", marks=OPENVINO)])
def test_an_engine_asked_for_runs_the_same_numbers_as_predict_says(ckpt, capsys, engine):
    if not available(engine):
        pytest.skip(f"{engine} is not installed")
    path, img = ckpt
    run = vitkit.engines.runner(path, engine=engine)
    assert run.line == f"engine: {engine}, fp32 (as asked)"
    assert run.line == _predict_line(capsys, str(path), str(img), "--engine", engine)
    _close_to_loaded(run, path, 1e-4)


@pytest.mark.openvino  # --fast picks OpenVINO where it is installed
def test_fast_picks_as_predict_fast_does(ckpt, capsys):
    path, img = ckpt
    run = vitkit.engines.runner(path, fast=True)
    assert run.line == _predict_line(capsys, str(path), str(img), "--fast")
    want = next(e for e in ("openvino", "onnxruntime", "torch") if e == "torch" or available(e))
    assert run.line.startswith(f"engine: {want}, fp32 (--fast: the fastest exact fp32 path")
    _close_to_loaded(run, path, 1e-4)


@pytest.mark.skipif(not native_bf16(torch.device("cpu")), reason="this CPU has no native bf16")
def test_bf16_weights_as_predict_runs_them(ckpt, capsys):
    path, img = ckpt
    run = vitkit.engines.runner(path, precision="bf16")
    assert run.line == "engine: torch, bf16 (default; bf16 weights)"
    assert run.line == _predict_line(capsys, str(path), str(img), "--precision", "bf16")
    _close_to_loaded(run, path, 5e-2)


def test_an_int8_directory_runs_as_written_beside_its_fp32_source(ckpt, tmp_path):
    pytest.importorskip("onnxruntime")
    path, _ = ckpt
    assert main(["export", str(path), str(tmp_path / "q"), "--int8"]) == 0
    run = vitkit.engines.runner(tmp_path / "q")
    assert run.line == "engine: onnxruntime, int8 (as written)"
    from vitkit.engines.checkpoint_runner import source_reference

    fp32, src, source = source_reference(run.checkpoint)
    assert src.path == vitkit.load_model(path)[1].path and fp32 is not None
    _close_to_loaded(run, path, 0.2)  # (int8: near, not equal)
    with pytest.raises(VitkitError, match="an exported int8 model runs at int8 only"):
        vitkit.engines.runner(tmp_path / "q", precision="fp32")
    # loading options read a checkpoint: with an engine directory they would change nothing
    with pytest.raises(VitkitError, match=r"loading options \(num_heads=2\) change nothing"):
        vitkit.engines.runner(tmp_path / "q", num_heads=2)


def test_loading_options_with_an_engine_directory_are_refused_not_ignored(ckpt, tmp_path, capsys):
    pytest.importorskip("onnxruntime")
    path, img = ckpt
    assert main(["export", str(path), str(tmp_path / "q"), "--int8"]) == 0
    capsys.readouterr()
    assert main(["predict", "--from", str(tmp_path / "q"), str(img), "--num-heads", "2"]) != 0
    err = capsys.readouterr().err
    assert "an engine directory runs its exported graph; loading options (num_heads=2)" in err
    assert main(["predict", "--from", str(tmp_path / "q"), str(img)]) == 0
    with pytest.raises(VitkitError, match=r"a \.pt2 package runs as compiled; loading options"):
        vitkit.engines.runner(tmp_path / "never_read.pt2", arch="Ti/16")


def test_refusals_are_one_line(ckpt):
    path, _ = ckpt
    with pytest.raises(VitkitError, match="fp8_recipe and fp8_min_params set how precision fp8"):
        vitkit.engines.runner(path, fp8_recipe="rowwise")
    with pytest.raises(VitkitError, match="runs under the torch engine on a GPU, not openvino"):
        vitkit.engines.runner(path, precision="fp8", engine="openvino")


def test_importing_the_engines_package_imports_no_torch():
    code = "import sys, vitkit.engines; assert 'torch' not in sys.modules; vitkit.engines.runner"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_auto_precision_is_the_runners_decision_said_alike_by_predict_and_serve(
    ckpt, capsys, monkeypatch
):
    """precision="auto" is decided by the runner (bf16 where this CPU has it natively and the
    model's bf16 top-1 agrees with fp32's, else fp32): predict --precision auto and serve
    (auto by default) print the runner's line and its reason, word for word."""
    path, img = ckpt
    run = vitkit.engines.runner(path, precision="auto")
    said = f"precision: {run.precision} ({run.precision_why})"
    if native_bf16(torch.device("cpu")):
        assert run.precision in ("bf16", "fp32")
        assert run.precision_why.startswith(f"auto: {run.precision}")
        assert "synthetic images measured at start" in run.precision_why
        if run.precision == "bf16":
            assert run.line == "engine: torch, bf16 (default; bf16 weights)"
            assert run.reference is not None  # (the fp32 model it was measured against)
            _close_to_loaded(run, path, 5e-2)
    assert main(["predict", "--from", str(path), str(img), "--precision", "auto"]) == 0
    assert capsys.readouterr().out.splitlines()[:2] == [run.line, said]
    if importlib.util.find_spec("fastapi") is not None:  # (the serve extra)
        assert main(["serve", str(path), "--dry-run"]) == 0
        printed = capsys.readouterr().out.splitlines()
        assert run.line in printed and said in printed, printed
    monkeypatch.setattr(hardware, "native_bf16", lambda device: False)
    run = vitkit.engines.runner(path, precision="auto")
    assert run.line == "engine: torch, fp32 (default; Linear layers on oneDNN)"
    assert run.precision == "fp32"
    assert run.precision_why == "auto: fp32, this CPU has no native bf16 (AVX512-BF16 or AMX)"
    _close_to_loaded(run, path, 1e-5)
