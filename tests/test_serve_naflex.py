"""vitkit serve --max-seq-len: a NaFlex checkpoint, or its engine exported with --dynamic-size,
served with each image at its own aspect ratio (at most N patches, no crop), a forward's
images packed and padded to N: the probabilities ``vitkit predict --max-seq-len`` gives, in one
process and under --workers 2 (the images crossing to the model processes at their own
sizes); a NaFlex model without --max-seq-len and --max-seq-len on a fixed-size model are one
line each."""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image
from references import OPENVINO, needs_openvino, perturbed

pytest.importorskip("fastapi", reason="the serve extra is not installed (pip install '.[serve]')")

from test_serve import Server, call, multipart  # noqa: E402
from test_serve_admission import start  # noqa: E402
from test_serve_bounds import fp32_unless_asked  # noqa: E402

import vitkit  # noqa: E402
from vitkit.cli import main  # noqa: E402

SEQ = "24"  # patches of 4x4 px: a tall and a wide image of a different grid each
# (H, W) of the image files; the BMP is decoded in a decode process (no PyTorch there), the
# small PNG on the event loop
SIZES = {"tall.png": (30, 20), "wide.bmp": (13, 50)}


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("serve_naflex")
    torch.manual_seed(0)
    model = perturbed(
        vitkit.create_model(
            "Ti/4", image_size=16, naflex=True, naflex_grid=(4, 4), naflex_antialias=False,
            pool="map", width=32, depth=2, num_heads=2, mlp_dim=64, num_classes=10,
        )
    )  # fmt: skip
    with torch.no_grad():
        model.pos_embed.normal_(0, 1)  # a table far from smooth: each grid resamples it apart
        model.head.weight.normal_(0, 1)  # probabilities spread: they say which input ran
    vitkit.save_checkpoint(d / "ck", model)
    fixed = vitkit.create_model("Ti/4", image_size=16, width=32, depth=1, num_heads=2,
                                mlp_dim=64, num_classes=3)  # fmt: skip
    vitkit.save_checkpoint(d / "fixed", fixed)
    for i, (name, (h, w)) in enumerate(SIZES.items()):
        pixels = np.random.default_rng(i).integers(0, 256, (h, w, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(d / name)
    return d


def predicted(work: Path, capsys: Any, source: Path) -> list[list[dict[str, Any]]]:
    paths = [str(work / name) for name in SIZES]
    capsys.readouterr()
    argv = ["predict", "--from", str(source), *paths, "--max-seq-len", SEQ, "--json"]
    assert main([*argv, "--top-k", "10"]) == 0
    return [json.loads(line)["top_k"] for line in capsys.readouterr().out.splitlines()]


def classified(port: int, work: Path) -> list[list[dict[str, Any]]]:
    """Both images in one request: one forward, packed together."""
    body, headers = multipart([(work / name).read_bytes() for name in SIZES])
    status, raw = call(port, "/v1/classify?top_k=10", body, headers)[:2]
    assert status == 200, raw
    return [r["top_k"] for r in json.loads(raw)["results"]]


def same_probabilities(served: list[Any], expected: list[Any]) -> None:
    assert len(served) == len(expected) == 2
    for got, want in zip(served, expected):
        order = {q["label"]: q["prob"] for q in got}
        assert sorted(order) == sorted(q["label"] for q in want)  # all 10 classes
        np.testing.assert_allclose(
            [order[q["label"]] for q in want], [q["prob"] for q in want], atol=1e-5
        )
    assert served[0] != served[1]  # (two different inputs: not one image answered twice)


def test_a_naflex_checkpoint_is_served_with_predicts_probabilities(work, capsys):
    """Refused before ("the server runs fixed-size models"): a tall and a wide image in one
    batch, each at its own aspect ratio, get predict --max-seq-len's probabilities."""
    s = Server([str(work / "ck"), "--max-seq-len", SEQ])
    try:
        got = classified(s.port, work)
        status, raw = call(s.port, "/v1/info")[:2]
        assert status == 200 and json.loads(raw)["model"]["max_seq_len"] == int(SEQ), raw
        # attention maps are of one fixed-size image: refused in one line, 409
        status, raw = call(s.port, "/v1/explain", (work / "tall.png").read_bytes())[:2]
        assert status == 409 and "NaFlex" in json.loads(raw)["error"], raw
    finally:
        s.stop()
    same_probabilities(got, predicted(work, capsys, work / "ck"))
    # each image at its own aspect ratio: the checkpoint's 16x16 centre crop answers otherwise
    paths = [str(work / name) for name in SIZES]
    assert main(["predict", "--from", str(work / "ck"), *paths, "--json", "--top-k", "10"]) == 0
    cropped = [json.loads(line)["top_k"] for line in capsys.readouterr().out.splitlines()]
    for a, b in zip(got, cropped):
        probs = {q["label"]: q["prob"] for q in b}
        assert max(abs(q["prob"] - probs[q["label"]]) for q in a) > 1e-3


@needs_openvino
def test_a_naflex_engine_directory_is_served_with_predicts_probabilities(work, capsys):
    out = engine_dir(work)
    s = Server([str(out), "--max-seq-len", SEQ])
    try:
        got = classified(s.port, work)
    finally:
        s.stop()
    same_probabilities(got, predicted(work, capsys, out))
    same_probabilities(got, predicted(work, capsys, work / "ck"))  # (and its source's)


def engine_dir(work: Path) -> Path:
    """The checkpoint's OpenVINO engine directory of any size (written once)."""
    pytest.importorskip("onnxscript")
    pytest.importorskip("openvino")
    out = work / "ov"
    if not out.exists():
        argv = ["export", str(work / "ck"), str(out), "--engine", "openvino", "--dynamic-size"]
        assert main([*argv, "--max-size", "64"]) == 0
    return out


@pytest.mark.parametrize("source", ["checkpoint", pytest.param("engine", marks=OPENVINO)])
def test_naflex_under_two_model_processes_answers_what_predict_does(work, capsys, source):
    """--workers 2: the front's shared memory holds each image at its own size."""
    served = work / "ck" if source == "checkpoint" else engine_dir(work)
    args = [str(served), "--port", "0", "--workers", "2", *fp32_unless_asked([str(served)])[1:]]
    proc, lines = start([*args, "--max-seq-len", SEQ, "--max-wait-ms", "200"])
    try:
        assert lines[-1].startswith("ready: http://127.0.0.1:"), "".join(lines)
        port = int(lines[-1].rsplit(":", 1)[1].strip(" /\n"))
        got = classified(port, work)
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    same_probabilities(got, predicted(work, capsys, work / "ck"))


@pytest.mark.parametrize(
    "model, more, said",
    [
        ("ck", [], "a NaFlex model (images at their own aspect ratio): serve it with "
         "--max-seq-len N"),
        ("fixed", ["--max-seq-len", "9"], "--max-seq-len packs images for a NaFlex model; "
         "this one takes 16x16 images"),
        ("ck", ["--max-seq-len", SEQ, "--engine", "onnxruntime"], "onnxruntime runs this "
         "NaFlex model exported at one size: serve it with --engine torch"),
    ],
    ids=["naflex_without_max_seq_len", "max_seq_len_on_a_fixed_size_model", "one_size_engine"],
)  # fmt: skip
def test_what_cannot_be_served_is_one_line(work, capsys, model, more, said):
    if "onnxruntime" in more:
        pytest.importorskip("onnxscript")
        pytest.importorskip("onnxruntime")
    capsys.readouterr()
    argv = ["serve", str(work / model), *more, "--precision", "fp32", "--dry-run"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert said in err and len(err.splitlines()) == 1, err


def test_a_naflex_run_is_served_at_the_length_it_trained_with(work, tmp_path, capsys):
    """As predict: no --max-seq-len, the run's own (said in one line), not a refusal."""
    from vitkit.cli import build_parser
    from vitkit.cli.serve import served_model

    model = vitkit.load(work / "ck")
    vitkit.save_checkpoint(tmp_path / "run", model, meta={"train_config": {"max_seq_len": 12}})
    args = build_parser().parse_args(["serve", *fp32_unless_asked([str(tmp_path / "run")])])
    capsys.readouterr()
    served = served_model(args)
    assert served.max_seq_len == 12 and served.describe()["model"]["max_seq_len"] == 12
    assert "a NaFlex run trained with --max-seq-len 12" in capsys.readouterr().err
    image = served.prepare((work / "wide.bmp").read_bytes(), served_limits(args))
    assert tuple(image.shape) == (3, 8, 24)  # 13x50 px at its aspect ratio: 2x6 patches
    served.warm_up(2)
    # the decode bounds stay: the resize's intermediates (24x13 + 24x8 px) refused from the
    # header under --max-resize-pixels, naming the NaFlex size
    from vitkit.serve.request_images import RequestError

    tight = build_parser().parse_args(
        ["serve", str(tmp_path / "run"), "--max-resize-pixels", "500"]
    )
    with pytest.raises(RequestError) as e:
        served.prepare((work / "wide.bmp").read_bytes(), served_limits(tight))
    assert e.value.status == 413
    assert "50x13 pixels would be resized to 24x8 (at most 12 patches)" in e.value.message


def served_limits(args: Any) -> Any:
    from vitkit.cli.serve_bounds import request_limits

    return request_limits(args)
