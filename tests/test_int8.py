"""int8 export and the engines: a round trip on a tiny model, the missing-engine line, the
accuracy report beside the fp32 source."""

from __future__ import annotations

import builtins
import json

import numpy as np
import pytest
import torch
from PIL import Image
from references import OPENVINO, needs_openvino

import vitkit
from vitkit.checkpoints import save_checkpoint
from vitkit.cli import main
from vitkit.engines.backends import available, load_engine_dir, require
from vitkit.engines.int8 import calibration_images
from vitkit.errors import VitkitError

pytest.importorskip("onnxscript")
pytest.importorskip("onnxruntime")


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    """A tiny trained-looking model on the 8x8 digits (its own dataset, for calibration)."""
    pytest.importorskip("sklearn")
    d = tmp_path_factory.mktemp("int8")
    torch.manual_seed(0)
    m = vitkit.create_model(
        "Ti/4", image_size=8, in_chans=1, num_classes=10, width=32, depth=2, num_heads=2, mlp_dim=64
    )
    with torch.no_grad():
        for p in m.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    save_checkpoint(d / "ck", m, meta={"dataset": "digits"})
    return d, m


ENGINES = ["onnxruntime", pytest.param("openvino", marks=OPENVINO)]


@pytest.mark.parametrize("engine", ENGINES)
def test_int8_round_trip_and_accuracy_report(ckpt, capsys, engine):
    d, model = ckpt
    out = d / f"q-{engine}"
    args = ["export", str(d / "ck"), str(out), "--int8", "--engine", engine, "--calib-images", "16"]
    args += ["--static"] if engine == "onnxruntime" else []  # (openvino always calibrates)
    assert main(args) == 0
    info = json.loads((out / "engine.json").read_text())
    assert info["precision"] == "int8" and info["calibration"]["images"] == 16
    assert info["calibration"]["data"] == "digits"
    q, ck = load_engine_dir(out)
    x = calibration_images(ck, "digits", 8, split="test")  # images like the calibration's
    with torch.no_grad():
        ref = model.eval()(x)
    got = q(x)
    assert got.shape == ref.shape and torch.isfinite(got).all()
    cos = torch.nn.functional.cosine_similarity(got.flatten(), ref.flatten(), dim=0)
    assert cos > 0.9  # int8 (a tiny random model: its logits are close together), not garbage
    # never over an existing model without --overwrite, never into the checkpoint read
    assert main(args) == 2
    assert "already holds" in capsys.readouterr().err
    assert main(args + ["--overwrite"]) == 0
    assert main(["export", str(d / "ck"), str(d / "ck" / "q"), "--int8", "--engine", engine]) == 2
    assert "which this command reads" in capsys.readouterr().err
    # eval beside the fp32 source: difference and agreement, printed and in eval.json
    assert main(["eval", "--from", str(out), "--out", str(d / f"ev-{engine}")]) == 0
    printed = capsys.readouterr().out
    assert "vs fp32 source" in printed and "top-1 agreement" in printed
    record = json.loads((d / f"ev-{engine}" / "eval.json").read_text())
    v = record["versus_source"]
    assert record["precision"] == "int8" and record["engine"] == engine
    assert v["top1_difference"] == pytest.approx(v["top1"] - v["source_top1"])
    assert 90 <= v["top1_agreement"] <= 100


@pytest.mark.openvino  # --fast picks OpenVINO where it is installed
def test_fp32_through_an_engine_and_fast_say_which(ckpt, capsys, tmp_path):
    d, _ = ckpt
    from PIL import Image

    img = tmp_path / "a.png"
    Image.new("L", (8, 8), 128).save(img)
    assert main(["predict", "--from", str(d / "ck"), str(img), "--engine", "torch"]) == 0
    torch_out = capsys.readouterr().out.splitlines()
    assert torch_out[0].startswith("engine: torch, fp32 (as asked")
    assert main(["predict", "--from", str(d / "ck"), str(img), "--fast"]) == 0
    fast_out = capsys.readouterr().out.splitlines()
    fastest = "openvino" if available("openvino") else "onnxruntime"
    assert fast_out[0].startswith(f"engine: {fastest}, fp32 (--fast")
    assert fast_out[1] == torch_out[1]  # the same labels and probabilities to 0.1 %


def test_an_engine_an_export_cannot_run_names_one_it_can(ckpt, capsys):
    """``predict --engine torch`` on an int8 export said "export it again with --engine torch",
    which export does not accept."""
    d, _ = ckpt
    out = d / "q-named"
    args = ["export", str(d / "ck"), str(out), "--int8", "--engine", "onnxruntime"]
    assert main([*args, "--calib-images", "8"]) == 0
    img = d / "digit.png"
    Image.fromarray(np.zeros((8, 8), np.uint8)).save(img)
    capsys.readouterr()
    assert main(["predict", "--from", str(out), str(img), "--engine", "torch"]) == 2
    err = capsys.readouterr().err
    assert "--engine onnxruntime or openvino" in err and "fp32 checkpoint" in err, err
    assert "again with --engine torch" not in err


def test_an_export_killed_before_its_end_leaves_nothing_a_later_one_keeps(ckpt):
    """``export --int8`` killed (SIGKILL) left its hidden ``.OUT.tmp-*`` directory, which no
    later run removed; the next export into the directory removes a dead writer's, and only
    that (a live process's stays)."""
    import os
    import subprocess
    import sys

    d, _ = ckpt
    out = d / "q-killed"
    out.mkdir()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = out / f".{out.name}.tmp-{dead.pid}"
    stale.mkdir()
    (stale / "fp32.onnx").write_bytes(b"half")
    live = out / f".{out.name}.tmp-{os.getppid()}"  # a running process (pytest's parent)
    live.mkdir()
    args = ["export", str(d / "ck"), str(out), "--int8", "--engine", "onnxruntime"]
    assert main([*args, "--calib-images", "8"]) == 0
    assert not stale.exists() and live.is_dir()
    assert sorted(p.name for p in out.iterdir()) == sorted(["engine.json", "model.onnx", live.name])


def test_missing_engine_is_one_line_naming_the_extra(monkeypatch):
    real = builtins.__import__

    def fake(name, *a, **k):
        if name == "openvino":
            raise ImportError(name)
        return real(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", fake)
    with pytest.raises(VitkitError, match=r"pip install '\.\[openvino\]' in vitkit's clone"):
        require("openvino")
    assert not available("openvino")


@pytest.mark.openvino  # (with NNCF blocked, OpenVINO loads)
@pytest.mark.parametrize("blocked", ["openvino", "nncf"])
def test_export_for_openvino_without_its_packages_is_one_line(ckpt, capsys, monkeypatch, blocked):
    """The test extra installs OpenVINO and NNCF: their absence is simulated (an import of a
    module set to None in sys.modules fails as a missing one does). Each export and run path
    that needs it says which extra installs it, and writes nothing."""
    import sys

    d, _ = ckpt
    monkeypatch.setitem(sys.modules, blocked, None)
    runs = [["export", str(d / "ck"), str(d / "ov-none"), "--int8", "--engine", "openvino"]]
    if blocked == "openvino":
        runs += [
            ["export", str(d / "ck"), str(d / "ov-none"), "--engine", "openvino"],
            ["eval", "--from", str(d / "ck"), "--engine", "openvino"],
        ]
    for args in runs:
        assert main(args) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "Traceback" not in err, err
        assert "pip install '.[openvino]' in vitkit's clone" in err, err
        assert not (d / "ov-none").exists()


def test_int8_options_need_int8(ckpt, capsys):
    d, _ = ckpt
    assert main(["export", str(d / "ck"), str(d / "x"), "--engine", "onnxruntime"]) == 2
    assert "add --int8" in capsys.readouterr().err


def test_static_int8_keeps_the_patch_embedding_and_head_in_fp32(ckpt):
    """Static QDQ int8 quantizes the blocks' matmuls, not the first and last layers: quantizing
    the patch-embedding conv and the head took a shapes-hard model from 85.5 % to 70.0 %
    agreement with fp32."""
    onnx = pytest.importorskip("onnx")
    d, _ = ckpt
    out = d / "q-static-ops"
    args = ["export", str(d / "ck"), str(out), "--int8", "--static", "--calib-images", "16"]
    assert main(args) == 0
    g = onnx.load(str(out / "model.onnx")).graph
    made_by = {o: n.op_type for n in g.node for o in n.output}

    def quantized(n) -> bool:
        return "DequantizeLinear" in [made_by.get(i) for i in n.input]

    first_last = [n for n in g.node if n.op_type in ("Conv", "Gemm")]
    assert any(n.op_type == "Conv" for n in first_last)  # the patch embedding is in the graph
    assert not [n.name for n in first_last if quantized(n)]
    assert [n for n in g.node if n.op_type == "MatMul" and quantized(n)]  # the blocks are int8


def test_keep_fp32_leaves_the_named_modules_matmuls_in_fp32(ckpt):
    """`--keep-fp32 mlp.fc2`: every block's fc2 stays a float MatMul, the rest is int8 (on a
    shapes-hard ViT it took dynamic int8 from 98.92 % to 99.13 % agreement with fp32)."""
    onnx = pytest.importorskip("onnx")
    d, _ = ckpt

    def float_matmuls(out) -> list[str]:
        g = onnx.load(str(out / "model.onnx")).graph
        weights = {i.name for i in g.initializer if i.data_type == onnx.TensorProto.FLOAT}
        return [n.name for n in g.node if n.op_type == "MatMul" and weights & set(n.input)]

    assert main(["export", str(d / "ck"), str(d / "q-all"), "--int8"]) == 0
    assert float_matmuls(d / "q-all") == []
    out = d / "q-keep"
    assert main(["export", str(d / "ck"), str(out), "--int8", "--keep-fp32", "mlp.fc2"]) == 0
    assert len(float_matmuls(out)) == 2  # depth 2: blocks.0.mlp.fc2 and blocks.1.mlp.fc2
    assert json.loads((out / "engine.json").read_text())["keep_fp32"] == ["mlp.fc2"]

    def plain_matmuls(out) -> set[str]:
        g = onnx.load(str(out / "model.onnx")).graph
        made_by = {o: n.op_type for n in g.node for o in n.output}
        return {n.name for n in g.node if n.op_type == "MatMul" and "DequantizeLinear" not in
                [made_by.get(i) for i in n.input]}  # fmt: skip

    static = ["--int8", "--static", "--calib-images", "16"]
    assert main(["export", str(d / "ck"), str(d / "q-static-all"), *static]) == 0
    keep = ["--keep-fp32", "blocks.1.attn.qkv"]
    assert main(["export", str(d / "ck"), str(d / "q-static-keep"), *static, *keep]) == 0
    kept = plain_matmuls(d / "q-static-keep") - plain_matmuls(d / "q-static-all")
    assert len(kept) == 1  # block 1's qkv, and only it


def test_keep_fp32_refusals_are_one_line_and_leave_no_directory(ckpt, capsys):
    d, _ = ckpt
    out = d / "q-bad"
    assert main(["export", str(d / "ck"), str(out), "--int8", "--keep-fp32", "mlp.fc3"]) == 2
    err = capsys.readouterr().err.strip()
    assert "--keep-fp32 mlp.fc3: no matmul of the model lies in such a module" in err
    assert "mlp.fc1, mlp.fc2" in err and len(err.splitlines()) == 1
    assert not out.exists()
    assert main(["export", str(d / "ck"), str(out), "--keep-fp32", "mlp.fc2"]) == 2
    assert "add --int8" in capsys.readouterr().err
    assert not out.exists()


@needs_openvino
def test_keep_fp32_under_openvino_leaves_those_matmuls_unquantized(ckpt):
    """NNCF's ignored scope: the named modules' MatMuls get no FakeQuantize on their inputs,
    the other blocks' matmuls do."""
    import openvino as ov

    d, _ = ckpt

    def quantized(out) -> dict[str, bool]:
        model = ov.Core().read_model(str(out / "model.xml"))
        return {
            op.get_friendly_name(): any(
                op.input_value(i).get_node().get_type_name() == "FakeQuantize"
                for i in range(op.get_input_size())
            )
            for op in model.get_ops()
            if op.get_type_name() == "MatMul"
        }

    args = ["--int8", "--engine", "openvino", "--calib-images", "16"]
    assert main(["export", str(d / "ck"), str(d / "ov-all"), *args]) == 0
    out = d / "ov-keep"
    assert main(["export", str(d / "ck"), str(out), *args, "--keep-fp32", "mlp.fc2"]) == 0
    everything, kept = quantized(d / "ov-all"), quantized(out)
    now_fp32 = [n for n in kept if everything[n] and not kept[n]]
    assert len(now_fp32) == 2  # depth 2: each block's fc2
    assert sum(kept.values()) == sum(everything.values()) - 2 > 0
    assert json.loads((out / "engine.json").read_text())["keep_fp32"] == ["mlp.fc2"]


@pytest.fixture(scope="module")
def engine_dirs(ckpt):
    """One int8 folder per engine, written where first asked for (OpenVINO's in its own
    process); each test damages a copy."""
    d, _ = ckpt

    def intact(engine: str):
        out = d / f"intact-{engine}"
        if not out.exists():
            args = ["export", str(d / "ck"), str(out), "--int8", "--engine", engine]
            args += ["--calib-images", "8"] + (["--static"] if engine == "onnxruntime" else [])
            assert main(args) == 0
        return out

    return intact


def damaged(tmp_path, folder, how):
    import shutil

    copy = tmp_path / folder.name
    shutil.copytree(folder, copy)
    info = json.loads((copy / "engine.json").read_text())
    files = [copy / f for f in info["files"].values()]
    files += [f.with_suffix(".bin") for f in files if f.suffix == ".xml"]
    for f in files:
        data = f.read_bytes()
        damaged = (
            data[: len(data) // 3]
            if how == "truncated"
            else bytes(np.random.default_rng(0).integers(0, 256, len(data), dtype=np.uint8))
        )
        f.write_bytes(damaged)
    return copy, files[0]


@pytest.mark.parametrize("how", ["truncated", "random"])
@pytest.mark.parametrize("engine", ENGINES)
def test_a_damaged_engine_file_is_one_line_naming_it(engine_dirs, tmp_path, capsys, engine, how):
    """model.onnx truncated or overwritten with random bytes inside an --int8 folder: predict
    printed onnxruntime's InvalidProtobuf traceback (OpenVINO's files alike; its half runs
    where openvino is installed)."""
    folder, model_file = damaged(tmp_path, engine_dirs(engine), how)
    img = tmp_path / "img.png"
    Image.fromarray(np.zeros((8, 8), dtype=np.uint8)).save(img)
    for args in (["predict", str(img), "--from", str(folder)], ["eval", "--from", str(folder)]):
        code = main(args)
        err = capsys.readouterr().err
        assert code == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
        assert str(model_file) in err and f"{engine} cannot load it" in err, err


def test_engine_json_with_more_class_names_than_outputs_is_refused(engine_dirs, tmp_path, capsys):
    """1,000,000 class names for 10 outputs were accepted from engine.json (a run's config.json
    with the same list is refused): refused alike, and a class_names that is no list too."""
    import shutil

    folder = tmp_path / "q"
    shutil.copytree(engine_dirs("onnxruntime"), folder)
    info = json.loads((folder / "engine.json").read_text())
    img = tmp_path / "img.png"
    Image.fromarray(np.zeros((8, 8), dtype=np.uint8)).save(img)
    for names, expected in (
        ([f"c{i}" for i in range(1_000_000)], "1,000,000 class_names for a head of 10 outputs"),
        (["a", "b"], "2 class_names for a head of 10 outputs"),
        ("abcdefghij", "class_names is a str, not a list"),
    ):
        (folder / "engine.json").write_text(json.dumps({**info, "class_names": names}))
        assert main(["predict", str(img), "--from", str(folder)]) == 2
        err = capsys.readouterr().err
        assert expected in err and str(folder / "engine.json") in err, err
        assert len(err.strip().splitlines()) == 1, err
    (folder / "engine.json").write_text(json.dumps(info))
    assert main(["predict", str(img), "--from", str(folder)]) == 0


def test_the_position_matmuls_of_an_export_of_any_size_stay_fp32(tmp_path):
    """An antialiased E_pos in a graph of any size is two matrix products: on this small grid
    (its table a constant of the graph) dynamic and static int8 quantized them as weight
    matmuls, the position table rounded to 8 bits. They stay float MatMuls now; the blocks' are
    int8."""
    onnx = pytest.importorskip("onnx")
    pytest.importorskip("sklearn")
    from vitkit.engines.int8 import position_nodes

    torch.manual_seed(0)
    m = vitkit.create_model(
        "Ti/4", image_size=8, in_chans=1, num_classes=10, width=32, depth=2, num_heads=2,
        mlp_dim=64, pos_resample="bicubic-antialias",
    )  # fmt: skip
    save_checkpoint(tmp_path / "ck", m, meta={"dataset": "digits"})
    assert main(["export", str(tmp_path / "ck"), str(tmp_path / "f.onnx"), "--dynamic-size"]) == 0
    position = position_nodes(tmp_path / "f.onnx")
    assert len(position) == 2  # rows and columns
    for extra in ([], ["--static", "--calib-images", "8"]):
        out = tmp_path / f"q{len(extra)}"
        args = ["export", str(tmp_path / "ck"), str(out), "--int8", "--dynamic-size", *extra]
        assert main(args) == 0
        g = onnx.load(str(out / "model.onnx")).graph
        made_by = {o: n.op_type for n in g.node for o in n.output}
        float_matmuls = {
            n.name for n in g.node if n.op_type == "MatMul" and not {
                made_by.get(i) for i in n.input} & {"DequantizeLinear", "DynamicQuantizeLinear"}
        }  # fmt: skip
        assert set(position) <= float_matmuls, (position, float_matmuls)
        assert any(n.op_type in ("MatMulInteger", "DequantizeLinear") for n in g.node)
