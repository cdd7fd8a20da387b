"""Exports at any image size (--dynamic-size) and of the backbone's features (--features):
onnxruntime equals PyTorch (and timm) at sizes the graph was not traced at; sizes an export does
not take are refused in one line, at export and at run time."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from references import import_reference, perturbed

import vitkit
from vitkit.checkpoints import load_model, save_checkpoint
from vitkit.cli import main
from vitkit.engines.dynamic_size import SizeRange, exact_range, size_range
from vitkit.errors import VitkitError

pytest.importorskip("onnxscript")
ort = pytest.importorskip("onnxruntime")

TINY = dict(width=32, depth=2, num_heads=2, mlp_dim=64, num_classes=5)
DINO3 = dict(
    rope="dinov3", rope_half=True, abs_pos_embed=False, num_reg_tokens=4, pool="gap",
    layer_scale_init=1e-5, gelu="none",
)  # fmt: skip
NOT_TRACED = [(8, 8), (32, 12), (44, 40)]  # (traced at the checkpoint's own 16x24)


def saved(tmp_path, name="ck", **kw):
    model = vitkit.create_model("Ti/4", image_size=(16, 24), **{**TINY, **kw})
    perturbed(model)
    if model.pos_embed is not None:  # a table far from smooth: the kernels differ on it
        with torch.no_grad():
            model.pos_embed.normal_(0, 1)
    save_checkpoint(tmp_path / name, model)
    return model.eval(), tmp_path / name


def relative(out, ref):
    return float(np.abs(out - ref).max() / np.abs(ref).max())


@pytest.mark.parametrize(
    "kw",
    [
        dict(pos_resample="bicubic"),
        dict(pos_resample="bicubic-antialias", num_reg_tokens=2),
        dict(pos_resample="bilinear", pool="gap"),
        dict(pos_resample="zoom"),
        DINO3,
    ],
    ids=["bicubic", "antialias_registers", "bilinear_gap", "zoom", "dinov3_rope"],
)
def test_dynamic_size_onnx_equals_pytorch_at_sizes_it_was_not_traced_at(tmp_path, capsys, kw):
    model, ck = saved(tmp_path, **kw)
    out = tmp_path / "m.onnx"
    assert main(["export", str(ck), str(out), "--dynamic-size", "--max-size", "48"]) == 0
    printed = capsys.readouterr().out
    assert "sides of 8 to 48 px in steps of 4" in printed, printed
    session = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    g = torch.Generator().manual_seed(1)
    for b, (h, w) in zip((1, 3, 2), NOT_TRACED):
        x = torch.randn(b, 3, h, w, generator=g)
        got = session.run(None, {"pixel_values": x.numpy()})[0]
        with torch.no_grad():
            want = model(x).numpy()
        assert relative(got, want) <= 1e-4, (h, w)
    assert main(["inspect", str(out), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["sizes"] == {"step": 4, "min": 8, "max": 48}
    assert info["source"] == str(ck.resolve()) and info["precision"] == "fp32"
    assert info["check"]["max_relative_error"] <= 1e-4 and len(info["check"]["sizes"]) >= 4


def test_dynamic_size_onnx_equals_timm_at_another_size(tmp_path):
    """A timm folder (dynamic_img_size: timm resamples E_pos with its antialiased bicubic on
    every forward) exported once, run at sizes it was not traced at, equals timm there."""
    timm = import_reference("timm")
    from timm.models._hub import save_for_hf

    ref = timm.create_model(
        "vit_base_patch16_224", img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2,
        num_classes=5, dynamic_img_size=True,
    )  # fmt: skip
    perturbed(ref).eval()
    with torch.no_grad():
        ref.pos_embed.normal_(0, 1)
    save_for_hf(ref, str(tmp_path / "t"), safe_serialization=True)
    assert main(["export", str(tmp_path / "t"), str(tmp_path / "t.onnx"), "--dynamic-size"]) == 0
    session = ort.InferenceSession(str(tmp_path / "t.onnx"), providers=["CPUExecutionProvider"])
    for h, w in [(16, 16), (24, 56), (64, 40)]:
        x = torch.randn(2, 3, h, w)
        got = session.run(None, {"pixel_values": x.numpy()})[0]
        with torch.no_grad():
            assert relative(got, ref(x).numpy()) <= 1e-4, (h, w)


def test_features_export_equals_forward_intermediates(tmp_path, capsys):
    model, ck = saved(tmp_path, num_reg_tokens=1, depth=3)
    out = tmp_path / "f.onnx"
    args = ["--features", "--out-indices", "0,-1", "--norm", "--prefix-tokens", "--dynamic-size"]
    assert main(["export", str(ck), str(out), *args]) == 0
    assert "output block0, block2, block0_prefix, block2_prefix" in capsys.readouterr().out
    nlc = tmp_path / "n.onnx"
    assert main(["export", str(ck), str(nlc), "--features", "--output-fmt", "NLC"]) == 0
    session = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    assert [o.name for o in session.get_outputs()] == [
        "block0", "block2", "block0_prefix", "block2_prefix"
    ]  # fmt: skip
    for h, w in [(16, 24), *NOT_TRACED]:
        x = torch.randn(2, 3, h, w)
        got = session.run(None, {"pixel_values": x.numpy()})
        with torch.no_grad():
            want = model.forward_intermediates(
                x, [0, -1], return_prefix_tokens=True, norm=True, intermediates_only=True
            )
        for o, r in zip(got, [p for p, _ in want] + [c for _, c in want]):
            assert o.shape == tuple(r.shape) and relative(o, r.numpy()) <= 1e-4, (h, w)
    x = torch.randn(1, 3, 16, 24)
    got = ort.InferenceSession(str(nlc), providers=["CPUExecutionProvider"]).run(
        None, {"pixel_values": x.numpy()}
    )
    with torch.no_grad():
        want = model.forward_intermediates(x, output_fmt="NLC", intermediates_only=True)
    assert len(got) == 3 and all(relative(o, r.numpy()) <= 1e-4 for o, r in zip(got, want))


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--dynamic-size", "--min-size", "10"], "--min-size 10 is not a multiple of the patch 4"),
        (["--dynamic-size", "--max-size", "50"], "--max-size 50 is not a multiple of the patch 4"),
        (["--dynamic-size", "--min-size", "4"], "at least 2 patches"),
        (["--dynamic-size", "--min-size", "40", "--max-size", "20"], "is below --min-size 40"),
        (["--max-size", "40"], "bound --dynamic-size: add it"),
        (["--norm"], "shape --features: add it"),
        (["--features", "--out-indices", "a"], "--out-indices 'a'"),
        (["--features", "--out-indices", "7"], "asks for the last 7 blocks of 2"),
    ],
)
def test_export_refusals_are_one_line_and_write_nothing(tmp_path, capsys, args, words):
    _, ck = saved(tmp_path)
    assert main(["export", str(ck), str(tmp_path / "m.onnx"), *args]) != 0
    err = capsys.readouterr().err
    assert words in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "m.onnx").exists() and not list(tmp_path.glob(".m.onnx*"))


def test_int8_engine_of_any_size_runs_and_refuses_others_in_one_line(tmp_path, capsys):
    """export --int8 --dynamic-size: the engine runs at sizes in its range (top-1 as the fp32
    model's on these inputs) and refuses, in one line, a side that is not a multiple of the
    patch or is outside the range; predict runs it at the checkpoint's preprocessing size."""
    from PIL import Image

    from vitkit.engines.backends import load_engine_dir

    model, ck = saved(tmp_path)
    out = tmp_path / "q"
    assert main(["export", str(ck), str(out), "--int8", "--dynamic-size", "--max-size", "40"]) == 0
    capsys.readouterr()
    info = json.loads((out / "engine.json").read_text())
    assert info["sizes"] == {"step": 4, "min": 8, "max": 40}
    assert info["check"]["max_relative_error"] <= 1e-4
    em, _ = load_engine_dir(out)
    x = torch.randn(4, 3, 28, 12)
    with torch.no_grad():
        assert relative(em(x).numpy(), model(x).numpy()) < 0.2
    for h, w, words in [(30, 12, "height 30 is not a multiple of the patch 4"),
                        (28, 44, "width 44 is outside the export's range")]:  # fmt: skip
        with pytest.raises(VitkitError, match=words):
            em(torch.randn(1, 3, h, w))
    Image.fromarray(np.zeros((30, 50, 3), np.uint8)).save(tmp_path / "a.png")
    assert main(["predict", "--from", str(out), str(tmp_path / "a.png")]) == 0
    assert "a.png:" in capsys.readouterr().out


def test_size_range_defaults_and_the_range_where_an_inexact_kernel_holds():
    cfg = load_model_cfg()
    r = size_range(cfg)
    assert (r.step, r.min, r.max) == (4, 8, 48)  # 2 patches to twice the 24 px side
    assert SizeRange.from_dict(r.to_dict()) == r
    # an error growing away from the own side: the range kept is where it stays <= 1e-4
    ok = exact_range(SizeRange(4, 8, 64), 24, lambda s: 1e-6 * 10 ** (abs(s - 24) / 8))
    assert ok == SizeRange(4, 8, 40)
    assert exact_range(SizeRange(4, 8, 64), 24, lambda s: 1.0) is None


def load_model_cfg():
    return vitkit.create_model("Ti/4", image_size=(16, 24), **TINY).cfg


def test_a_fixed_size_export_still_refuses_nothing_new(tmp_path):
    """Without --dynamic-size the graph keeps the checkpoint's own size (the position table
    as it is) and equals PyTorch there."""
    model, ck = saved(tmp_path)
    assert main(["export", str(ck), str(tmp_path / "m.onnx")]) == 0
    session = ort.InferenceSession(str(tmp_path / "m.onnx"), providers=["CPUExecutionProvider"])
    inp = session.get_inputs()[0]
    assert inp.shape[2:] == [16, 24]
    model2, _ = load_model(ck)
    x = torch.randn(2, 3, 16, 24)
    with torch.no_grad():
        assert relative(session.run(None, {"pixel_values": x.numpy()})[0], model2(x).numpy()) < 1e-4


def test_an_inexact_kernel_narrows_the_range_and_says_so_in_one_line(capsys):
    """checked(): an export whose error grows past 1e-4 away from the own size takes only the
    sizes where it stays below, said in one line; over 1e-4 at the own size it is refused."""
    from vitkit.engines.export_record import checked

    def measure(points):
        return {f"{h}x{w}": 1e-6 * 10 ** (abs(max(h, w) - 24) / 8) for h, w in points}

    taken, check = checked(measure, (24, 24), SizeRange(4, 8, 64), where="m.onnx", kernel="k")
    assert taken == SizeRange(4, 8, 40) and check["narrowed_from"]["max"] == 64
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not exact" in err[0] and "sides of 8 to 40 px" in err[0]
    with pytest.raises(VitkitError, match="differs from vitkit PyTorch"):
        checked(lambda p: {f"{h}x{w}": 1.0 for h, w in p}, (24, 24), None, where="m", kernel="k")


def test_dynamic_size_of_a_model_without_patches_is_one_line(tmp_path, capsys):
    """A BiT ResNet (no patch grid) is refused in one line before anything is traced."""
    bit = vitkit.create_model("bit_r50x1", num_classes=3, layers=(1, 1, 1, 1), image_size=32)
    save_checkpoint(tmp_path / "bit", bit)
    assert main(["export", str(tmp_path / "bit"), str(tmp_path / "b.onnx"), "--dynamic-size"]) != 0
    err = capsys.readouterr().err
    assert "a BiT ResNet has no patch grid" in err and len(err.strip().splitlines()) == 1


def test_an_export_that_does_not_run_at_a_size_is_one_line():
    """The check's runtime failing at a size (here a fake graph refusing it) is one line
    naming the size, not the runtime's traceback."""
    from vitkit.engines.onnx_export import check_at_sizes

    model = vitkit.create_model("Ti/4", image_size=(16, 24), **TINY).eval()

    def run(x):
        if x.shape[-1] != 24:
            raise RuntimeError("Attempting to broadcast an axis\n  at node_add_17")
        return [model(torch.from_numpy(x)).detach().numpy()]

    assert check_at_sizes(model, run, [(16, 24)])["16x24"] <= 1e-6
    with pytest.raises(VitkitError, match=r"does not run at 8x8: Attempting to broadcast an axis$"):
        check_at_sizes(model, run, [(16, 24), (8, 8)])
