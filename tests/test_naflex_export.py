"""A NaFlex checkpoint exported at any size (``--dynamic-size``): the graph takes each image at
its own size and equals the NaFlex model in PyTorch on the packed batch (padding and masks
included) at sizes it was not traced at; predict runs such an engine on each image at its own
aspect ratio (``--max-seq-len``), as it runs the checkpoint."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from PIL import Image
from references import needs_openvino, perturbed

import vitkit
from vitkit.checkpoints import save_checkpoint
from vitkit.cli import main
from vitkit.models.naflex_packing import pack

pytest.importorskip("onnxscript")
ort = pytest.importorskip("onnxruntime")

NAFLEX = dict(
    naflex=True, naflex_grid=(4, 4), pool="map", width=32, depth=2, num_heads=2, mlp_dim=64,
    num_classes=10,
)  # fmt: skip


def saved(tmp_path, **kw):
    torch.manual_seed(0)
    model = perturbed(vitkit.create_model("Ti/4", image_size=16, **{**NAFLEX, **kw}))
    with torch.no_grad():
        model.pos_embed.normal_(0, 1)  # a table far from smooth: every size resamples it
    save_checkpoint(tmp_path / "ck", model, meta={"dataset": "digits"})
    return model, tmp_path / "ck"


@pytest.mark.parametrize(
    "kw",
    [{}, {"naflex_pos": "factorized", "naflex_ar_preserving": True}],
    ids=["learned_antialiased", "factorized_aspect_preserving"],
)
def test_naflex_export_of_any_size_equals_the_packed_model(tmp_path, capsys, kw):
    """Refused before ("a NaFlex model takes packed patches"): each image of a batch padded to
    80 patches with its valid mask, run by PyTorch, against the export run at that image's own
    size (the grid's E_pos resampled inside the graph), at three sizes it was not traced at."""
    model, ck = saved(tmp_path, **kw)
    out = tmp_path / "m.onnx"
    assert main(["export", str(ck), str(out), "--dynamic-size", "--max-size", "32"]) == 0
    assert "sides of 8 to 32 px in steps of 4" in capsys.readouterr().out
    session = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    g = torch.Generator().manual_seed(1)
    images = [torch.randn(3, h, w, generator=g) for h, w in [(8, 8), (32, 12), (20, 28)]]
    with torch.no_grad():
        packed = model(pack(images, (4, 4), max_seq_len=80)).numpy()
    for img, want in zip(images, packed):
        got = session.run(None, {"pixel_values": img[None].numpy()})[0][0]
        assert np.abs(got - want).max() <= 1e-4 * np.abs(want).max(), img.shape


@needs_openvino
def test_predict_runs_a_naflex_engine_at_each_images_own_size(tmp_path, capsys):
    _, ck = saved(tmp_path)  # antialiased bicubic: no Resize in the graph, exact under OpenVINO
    out = tmp_path / "ov"
    args = ["--engine", "openvino", "--dynamic-size", "--max-size", "64"]
    assert main(["export", str(ck), str(out), *args]) == 0
    paths = []
    for name, (h, w) in (("tall", (30, 20)), ("wide", (13, 50)), ("square", (40, 40))):
        pixels = np.random.default_rng(len(paths)).integers(0, 256, (h, w, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(tmp_path / f"{name}.png")
        paths.append(str(tmp_path / f"{name}.png"))
    capsys.readouterr()
    assert main(["predict", "--from", str(ck), *paths, "--max-seq-len", "24", "--json"]) == 0
    want = capsys.readouterr().out
    assert main(["predict", "--from", str(out), *paths, "--max-seq-len", "24", "--json"]) == 0
    got = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert len(got) == 3
    for g, w in zip(got, [json.loads(line) for line in want.splitlines()]):
        assert [p["label"] for p in g["top_k"]] == [p["label"] for p in w["top_k"]]
        assert np.allclose([p["prob"] for p in g["top_k"]], [p["prob"] for p in w["top_k"]],
                           atol=1e-5), (g, w)  # fmt: skip
    # eval: the engine and its fp32 source on the same packed images (9 patches: 12x12 px
    # digits, not the checkpoint's 16x16), so they agree on every image
    pytest.importorskip("sklearn")
    e = tmp_path / "e"
    assert main(["eval", "--from", str(out), "--max-seq-len", "9", "--out", str(e)]) == 0
    record = json.loads((e / "eval.json").read_text())
    assert record["max_seq_len"] == 9 and record["versus_source"]["top1_agreement"] == 100.0
    # an export of one size (engine.json without sizes, as without --dynamic-size): packed
    # patches are refused in one line
    info = json.loads((out / "engine.json").read_text())
    (out / "engine.json").write_text(json.dumps({**info, "sizes": None}))
    assert main(["predict", "--from", str(out), *paths, "--max-seq-len", "24"]) == 2
    err = capsys.readouterr().err.strip()
    assert "need an export of a NaFlex model's logits with --dynamic-size" in err, err
    assert len(err.splitlines()) == 1


def test_fast_runs_a_naflex_checkpoint_on_torch_at_each_images_own_size(tmp_path, capsys):
    """``--fast`` picked an engine exported here at one size, then refused the packed patches:
    a NaFlex checkpoint's fastest path that runs them is torch, with the same numbers."""
    _, ck = saved(tmp_path)
    pixels = np.random.default_rng(0).integers(0, 256, (30, 20, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(tmp_path / "tall.png")
    args = ["predict", "--from", str(ck), str(tmp_path / "tall.png"), "--max-seq-len", "24"]
    capsys.readouterr()
    assert main([*args, "--json"]) == 0
    want = json.loads(capsys.readouterr().out)
    assert main([*args, "--json", "--fast"]) == 0
    out = capsys.readouterr()
    assert "engine: torch, fp32 (--fast: a NaFlex model runs at each image's size" in out.err
    assert json.loads(out.out) == want
