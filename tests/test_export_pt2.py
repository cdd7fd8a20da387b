"""``vitkit export --format pt2``: torch.export + AOTInductor, dynamic batch and image size; the
package runs in a fresh process without vitkit's model code and equals PyTorch. AOTInductor
compiles C++ (minutes on a loaded 2-core host): one tiny package for the whole module."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from references import perturbed

import vitkit
from vitkit.checkpoints import save_checkpoint
from vitkit.cli import main

pytestmark = pytest.mark.slow  # (AOTInductor compiles C++ for the one package)

SRC = Path(__file__).resolve().parents[1] / "src"

RUN = """
import sys, json
import numpy as np, torch
from vitkit.engines.pt2_package import load_pt2
from vitkit.errors import VitkitError
from vitkit.eval.predict import predict_files
model, src = load_pt2(sys.argv[1])
g = torch.Generator().manual_seed(0)
outs = {}
for b, h, w in [(1, 16, 24), (3, 8, 8), (2, 32, 12), (1, 44, 40)]:
    outs[f"{h}x{w}"] = model(torch.randn(b, 3, h, w, generator=g)).numpy()
np.savez(sys.argv[2], **outs)
refused = []
for h, w in [(18, 24), (52, 24)]:
    try:
        model(torch.zeros(1, 3, h, w))
    except VitkitError as e:
        refused.append(str(e))
preds = predict_files(model, src, [sys.argv[3]], 3)
loaded = sorted(m for m in sys.modules if m.startswith(("vitkit.models", "vitkit.checkpoints")))
print(json.dumps({"refused": refused, "preds": preds, "loaded": loaded}))
"""


@pytest.fixture(scope="module")
def package(tmp_path_factory):
    d = tmp_path_factory.mktemp("pt2")
    model = vitkit.create_model(
        "Ti/4", image_size=(16, 24), width=32, depth=1, num_heads=2, mlp_dim=64, num_classes=6,
        pos_resample="bicubic-antialias",
    )  # fmt: skip
    perturbed(model).eval()
    with torch.no_grad():
        model.pos_embed.normal_(0, 1)
    save_checkpoint(d / "ck", model)
    out = d / "m.pt2"
    args = ["export", str(d / "ck"), str(out), "--format", "pt2", "--dynamic-size"]
    assert main([*args, "--max-size", "48"]) == 0
    return model, d, out


def test_pt2_runs_in_a_fresh_process_without_vitkit_models_and_equals_pytorch(package):
    model, d, out = package
    Image.fromarray((np.arange(30 * 40 * 3) % 251).astype(np.uint8).reshape(30, 40, 3)).save(
        d / "a.png"
    )
    env = {**os.environ, "PYTHONPATH": str(SRC), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-c", RUN, str(out), str(d / "o.npz"), str(d / "a.png")]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["loaded"] == [], got["loaded"]  # neither vitkit.models nor vitkit.checkpoints
    assert "height 18 is not a multiple of the patch 4" in got["refused"][0]
    assert "height 52 is outside the export's range" in got["refused"][1]
    outs = np.load(d / "o.npz")
    g = torch.Generator().manual_seed(0)
    for b, h, w in [(1, 16, 24), (3, 8, 8), (2, 32, 12), (1, 44, 40)]:
        with torch.no_grad():
            want = model(torch.randn(b, 3, h, w, generator=g)).numpy()
        diff = np.abs(outs[f"{h}x{w}"] - want).max() / np.abs(want).max()
        assert diff <= 1e-4, (h, w)
    from vitkit.eval.predict import predict_files

    ckpt = vitkit.checkpoints.read_checkpoint(d / "ck")
    want_preds = predict_files(model, ckpt, [d / "a.png"], 3)
    assert [p["index"] for p in got["preds"][0]] == [p["index"] for p in want_preds[0]]
    assert np.allclose([p["prob"] for p in got["preds"][0]], [p["prob"] for p in want_preds[0]])


def test_pt2_records_source_sizes_precision_and_check_and_predict_runs_it(package, capsys):
    _, d, out = package
    capsys.readouterr()
    assert main(["inspect", str(out)]) == 0
    text = capsys.readouterr().out
    assert "pt2 written by vitkit export" in text and "sides of 8 to 48 px in steps of 4" in text
    assert main(["inspect", str(out), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["source"] == str((d / "ck").resolve()) and info["precision"] == "fp32"
    assert info["check"]["max_relative_error"] <= 1e-4 and len(info["check"]["sizes"]) >= 4
    Image.fromarray(np.zeros((20, 20, 3), np.uint8)).save(d / "b.png")
    assert main(["predict", "--from", str(out), str(d / "b.png")]) == 0
    assert "engine: pt2 (AOTInductor), fp32" in capsys.readouterr().out
    assert main(["predict", "--from", str(out), str(d / "b.png"), "--engine", "onnxruntime"]) != 0
    assert "a .pt2 package runs as compiled" in capsys.readouterr().err


def test_eval_runs_a_pt2_package_as_it_runs_its_checkpoint(package, capsys):
    """eval --from OUT.pt2 on the shapes test split (6 classes, resized to the checkpoint's
    16x24): the same top-1 as the checkpoint it was exported from."""
    _, d, out = package
    top1 = []
    for src, where in ((out, "e_pt2"), (d / "ck", "e_ck")):
        assert main(["eval", "--from", str(src), "--data", "shapes", "--out", str(d / where)]) == 0
        found = json.loads((d / where / "eval.json").read_text())
        top1.append(found["metrics"]["top1"] if "metrics" in found else found["top1"])
    capsys.readouterr()
    assert abs(top1[0] - top1[1]) <= 0.2, top1  # (a near-tie may turn at 1e-6)


def test_serve_runs_a_pt2_package_batched_and_answers_what_predict_answers(package, capsys):
    """serve --from OUT.pt2 (precision auto: the package's own fp32): three images in one
    forward give predict's answers; /v1/info names the package and its size range; explain is
    refused in one line naming the checkpoint."""
    pytest.importorskip("fastapi", reason="the serve extra is not installed")
    from test_serve import Server, call, multipart, same_answers

    _, d, out = package
    rng = np.random.default_rng(3)
    images = []
    for i in range(3):
        images.append(d / f"s{i}.png")
        Image.fromarray(rng.integers(0, 255, (20 + 6 * i, 30, 3), np.uint8)).save(images[-1])
    capsys.readouterr()
    assert main(["predict", *map(str, images), "--from", str(out), "--json", "--top-k", "6"]) == 0
    want = [json.loads(line)["top_k"] for line in capsys.readouterr().out.splitlines()]
    s = Server([str(out), "--precision", "auto", "--max-wait-ms", "200"])
    try:
        body, headers = multipart([p.read_bytes() for p in images])
        status, raw = call(s.port, "/v1/classify?top_k=6", body, headers)
        assert status == 200, raw
        answer = json.loads(raw)
        assert answer["engine"] == "pt2" and answer["precision"] == "fp32"
        same_answers([r["top_k"] for r in answer["results"]], want)
        status, raw = call(s.port, "/v1/info")
        info = json.loads(raw)
        assert info["model"]["format"] == "pt2 package (torch.export + AOTInductor)"
        assert info["model"]["sizes"] == {"min": 8, "max": 48, "step": 4}, info["model"]
        assert "exported engine runs at the precision" in info["precision_why"]
        status, raw = call(s.port, "/v1/explain", images[0].read_bytes())
        assert status == 409 and b"serve the fp32 checkpoint it was exported from" in raw
    finally:
        s.stop()


def test_predict_from_pt2_in_a_fresh_process_imports_neither_models_nor_checkpoints(package):
    """The command itself (parser and all), not only the loader: ``vitkit predict --from
    OUT.pt2`` answers without vitkit.models or vitkit.checkpoints in sys.modules."""
    _, d, out = package
    Image.fromarray(np.full((20, 28, 3), 90, np.uint8)).save(d / "c.png")
    code = (
        "import sys\nfrom vitkit.cli import main\n"
        "assert main(['predict', '--from', sys.argv[1], sys.argv[2], '--json']) == 0\n"
        "print(sorted(m for m in sys.modules if m.startswith(('vitkit.models', "
        "'vitkit.checkpoints'))))"
    )
    env = {**os.environ, "PYTHONPATH": str(SRC), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-c", code, str(out), str(d / "c.png")]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.strip().splitlines()
    assert "top_k" in json.loads(lines[-2]) and lines[-1] == "[]", done.stdout[-2000:]
