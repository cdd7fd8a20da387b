"""bf16 CPU inference: ``--precision bf16`` on predict, serve, export and eval, the engine API,
and the one line refusing it on a CPU that would emulate bf16."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from PIL import Image
from references import needs_openvino

import vitkit
from vitkit.checkpoints import save_checkpoint
from vitkit.cli import main
from vitkit.engines.backends import engine_model, load_engine_dir
from vitkit.engines.bf16 import BF16Model, bf16_refusal
from vitkit.errors import VitkitError
from vitkit.hardware import native_bf16

NATIVE = native_bf16(torch.device("cpu"))
needs_bf16 = pytest.mark.skipif(not NATIVE, reason="this CPU has no native bf16")


def test_bf16_is_refused_in_one_line_saying_why_without_native_bf16():
    line = bf16_refusal(False, "Some CPU (2 vCPUs; avx2)")
    assert line is not None and "\n" not in line
    assert "Some CPU" in line and "no native bf16" in line and "emulated" in line
    assert "--precision fp32" in line
    assert bf16_refusal(True, "Some CPU") is None


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    """A tiny trained-looking model on the 8x8 digits (its own dataset, for the comparison)."""
    pytest.importorskip("sklearn")
    d = tmp_path_factory.mktemp("bf16")
    torch.manual_seed(0)
    m = vitkit.create_model(
        "Ti/4", image_size=8, in_chans=1, num_classes=10, width=32, depth=2, num_heads=2, mlp_dim=64
    )
    with torch.no_grad():
        for p in m.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    save_checkpoint(d / "ck", m, meta={"dataset": "digits"})
    img = d / "digit.png"
    Image.fromarray((np.arange(64).reshape(8, 8) * 4).astype(np.uint8)).save(img)
    return d, m.eval(), img


@needs_bf16
def test_engine_api_runs_bf16_weights_close_to_fp32(ckpt):
    _, model, _ = ckpt
    import copy

    x = torch.randn(16, 1, 8, 8)
    with torch.no_grad():
        ref = model(x)
    bf = engine_model(copy.deepcopy(model), "torch", "bf16")
    assert isinstance(bf, BF16Model) and bf.precision == "bf16"
    assert all(p.dtype == torch.bfloat16 for p in bf.model.parameters())  # converted once
    got = bf(x)
    assert got.dtype == torch.float32 and got.shape == ref.shape
    assert not torch.equal(got, ref)  # it did run in bf16
    assert (got - ref).abs().max() < 0.05 * ref.abs().max()
    with pytest.raises(VitkitError, match="not onnxruntime"):
        engine_model(copy.deepcopy(model), "onnxruntime", "bf16")
    with pytest.raises(VitkitError, match="fp32, bf16"):
        engine_model(copy.deepcopy(model), "torch", "fp16")


@needs_bf16
def test_predict_at_bf16_says_so_and_agrees_with_fp32(ckpt, capsys):
    d, _, img = ckpt
    assert main(["predict", "--from", str(d / "ck"), str(img), "--top-k", "1"]) == 0
    fp32 = capsys.readouterr().out.splitlines()[-1]
    args = ["predict", "--from", str(d / "ck"), str(img), "--top-k", "1", "--precision", "bf16"]
    assert main(args) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("engine: torch, bf16 (default; bf16 weights")
    assert out[1].split()[1] == fp32.split()[1]  # the same top-1 label
    assert main([*args, "--fast"]) == 0
    fast = capsys.readouterr().out.splitlines()[0]
    assert fast.startswith("engine: torch, bf16 (--fast: the fastest bf16 path"), fast


@needs_bf16
def test_eval_at_bf16_records_top1_against_fp32_and_agreement(ckpt, capsys):
    d, _, _ = ckpt
    out = d / "ev-bf16"
    args = ["eval", "--from", str(d / "ck"), "--precision", "bf16", "--out", str(out)]
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert "bf16 vs fp32 source" in printed and "top-1 agreement" in printed
    record = json.loads((out / "eval.json").read_text())
    v = record["versus_source"]
    assert record["precision"] == "bf16" and record["engine"] == "torch"
    assert v["top1"] == pytest.approx(100 * record["top1"])
    assert v["top1_difference"] == pytest.approx(v["top1"] - v["source_top1"])
    assert 95 <= v["top1_agreement"] <= 100


def test_eval_at_auto_runs_the_runners_choice_and_says_it(ckpt, capsys, tmp_path):
    """eval --precision auto: the precision vitkit.engines.runner chooses (bf16 where native
    and agreeing with fp32 on synthetic images, else fp32), said in its words, and the
    evaluation that precision gives; refused in one line on another device."""
    d, _, _ = ckpt
    run = vitkit.engines.runner(d / "ck", precision="auto")
    out = tmp_path / "ev-auto"
    assert main(["eval", "--from", str(d / "ck"), "--precision", "auto", "--out", str(out)]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed[0] == f"precision: {run.precision} ({run.precision_why})", printed
    record = json.loads((out / "eval.json").read_text())
    assert record["precision"] == run.precision
    same = tmp_path / "ev-same"
    argv = ["eval", "--from", str(d / "ck"), "--precision", run.precision, "--out", str(same)]
    assert main(argv) == 0
    assert json.loads((same / "eval.json").read_text())["top1"] == record["top1"]
    capsys.readouterr()
    argv = ["eval", "--from", str(d / "ck"), "--precision", "auto", "--device", "meta"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--precision auto decides for the CPU" in err[0], err


@needs_bf16
@needs_openvino
def test_export_bf16_for_openvino_records_precision_and_accuracy(ckpt, capsys, tmp_path):
    d, model, img = ckpt
    out = d / "ov-bf16"
    assert main(["export", str(d / "ck"), str(out), "--precision", "bf16"]) == 0
    printed = capsys.readouterr().out
    assert "(openvino, bf16)" in printed and "bf16 vs fp32 source" in printed
    info = json.loads((out / "engine.json").read_text())
    assert info["precision"] == "bf16" and info["engine"] == "openvino"
    v = info["versus_fp32"]
    assert v["top1_difference"] == pytest.approx(v["top1"] - v["source_top1"])
    assert 95 <= v["top1_agreement"] <= 100
    em, _ = load_engine_dir(out)
    x = torch.randn(4, 1, 8, 8)
    with torch.no_grad():
        ref = model(x)
    got = em(x)
    assert em.precision == "bf16" and (got - ref).abs().max() < 0.05 * ref.abs().max()
    assert main(["predict", "--from", str(out), str(img)]) == 0
    assert capsys.readouterr().out.startswith("engine: openvino, bf16 (as written)")
    # an exported model runs at its own precision; int8 and bf16 are one precision per export
    assert main(["predict", "--from", str(out), str(img), "--precision", "fp32"]) == 2
    assert "runs at bf16 only" in capsys.readouterr().err
    both = ["export", str(d / "ck"), str(tmp_path / "x"), "--precision", "bf16", "--int8"]
    assert main(both) == 2
    assert "one precision per export" in capsys.readouterr().err
    ort = ["export", str(d / "ck"), str(tmp_path / "y"), "--precision", "bf16"]
    assert main([*ort, "--engine", "onnxruntime"]) == 2
    assert "for openvino, not onnxruntime" in capsys.readouterr().err
    assert not (tmp_path / "x").exists() and not (tmp_path / "y").exists()


@needs_bf16
def test_serve_dry_run_at_bf16_serves_bf16(ckpt, capsys):
    pytest.importorskip("fastapi")
    d, _, _ = ckpt
    assert main(["serve", str(d / "ck"), "--precision", "bf16", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "engine: torch, bf16" in out, out


def test_fast_bf16_picks_openvino_for_a_server_and_torch_for_a_command_over_images():
    """OpenVINO's bf16 runs B/16 1.32x PyTorch's but starts 11 s later: ``serve --fast
    --precision bf16`` takes it where installed, ``predict`` / ``eval`` keep PyTorch."""
    from vitkit.engines.checkpoint_runner import fast_choice

    everything = lambda engine: True  # noqa: E731
    assert fast_choice("bf16", True, everything)[0] == "openvino"
    assert "for a server" in fast_choice("bf16", True, everything)[1]
    assert fast_choice("bf16", False, everything)[0] == "torch"
    assert fast_choice("bf16", True, lambda engine: False)[0] == "torch"
    assert fast_choice("fp32", False, everything)[0] == "openvino"
    assert fast_choice("fp32", True, lambda e: e == "onnxruntime")[0] == "onnxruntime"


@needs_bf16
@needs_openvino
def test_serve_fast_bf16_runs_openvino_and_says_so(ckpt, capsys):
    from vitkit.cli import build_parser
    from vitkit.cli.serve import served_model

    d, _, _ = ckpt
    args = build_parser().parse_args(["serve", str(d / "ck"), "--fast", "--precision", "bf16"])
    served = served_model(args)
    line = capsys.readouterr().out.splitlines()[0]
    assert line.startswith("engine: openvino, bf16 (--fast: the fastest bf16 path"), line
    assert served.engine == "openvino" and served.precision == "bf16"


@needs_openvino
def test_openvino_does_not_pin_its_threads_to_cores():
    """Two `serve --workers 2` processes of one thread each pinned that thread to the same core
    (B/16 served 0.49x one worker; 0.97x unpinned): the runner turns pinning off."""
    torch.manual_seed(0)
    m = vitkit.create_model(
        "Ti/4", image_size=8, in_chans=1, num_classes=3, width=16, depth=1, num_heads=2, mlp_dim=32
    ).eval()
    em = engine_model(m, "openvino", "fp32", threads=1)
    cells = [c.cell_contents for c in em._run.__closure__ or ()]
    request = next(c for c in cells if hasattr(c, "get_compiled_model"))
    assert request.get_compiled_model().get_property("ENABLE_CPU_PINNING") is False
    x = torch.randn(2, 1, 8, 8)
    assert torch.allclose(em(x), m(x), atol=1e-4)


@needs_openvino
def test_openvino_models_freed_out_of_order_leave_signal_handlers_working():
    """OpenVINO gives the compiling thread an alternate signal stack and puts the one before
    back when the compiled model is freed: two engines freed in another order than made left
    the thread on a freed stack, and the next Python signal handler killed the process with
    SIGSEGV, no traceback (how a whole test run died). The thread's own stack is kept now."""
    import gc
    import os
    import signal

    torch.manual_seed(0)
    model = vitkit.create_model(
        "Ti/4", image_size=8, in_chans=1, num_classes=3, width=16, depth=1, num_heads=2, mlp_dim=32
    ).eval()
    first = engine_model(model, "openvino", "fp32", threads=1)
    second = engine_model(model, "openvino", "fp32", threads=1)
    x = torch.randn(1, 1, 8, 8)
    first(x), second(x)
    del first
    gc.collect()
    del second
    gc.collect()
    heard = []
    old = signal.signal(signal.SIGUSR1, lambda *_: heard.append(1))
    try:
        os.kill(os.getpid(), signal.SIGUSR1)
    finally:
        signal.signal(signal.SIGUSR1, old)
    assert heard == [1]
