"""Every command that writes follows one rule (vitkit.output_files.check_destination): nothing is
written into a checkpoint being read, an existing file is replaced only with --overwrite, and
every file written has the mode the umask gives (issue 26, items 1-3)."""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import vitkit
from vitkit.checkpoints import save_checkpoint
from vitkit.cli import main

TINY = ["-o", "width=32", "-o", "depth=2", "-o", "num_heads=2", "-o", "mlp_dim=64"]
SHORT = ["--data", "digits", "--model", "Ti/2", *TINY, "--no-progress", "--batch-size", "32"]
SHORT += ["--epochs", "1", "--max-steps", "2"]


def run_cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(args)
    out, err = capsys.readouterr()
    return code, out, err


def snapshot(path: Path) -> dict[str, bytes]:
    return {str(p.relative_to(path)): p.read_bytes() for p in path.rglob("*") if p.is_file()}


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dest") / "run"
    assert main(["train", *SHORT, "--out-dir", str(out)]) == 0
    return out


@pytest.fixture
def run(tiny_run: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "run"
    shutil.copytree(tiny_run, dst)
    return dst


def image(tmp_path: Path) -> Path:
    path = tmp_path / "img.png"
    Image.fromarray(np.zeros((8, 8), dtype=np.uint8)).save(path)
    return path


# ----- item 1: never into the checkpoint read, never over a file without --overwrite ----------


def test_no_command_writes_into_the_checkpoint_it_reads(
    run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("onnxscript")
    step = next((run / "checkpoints").glob("step_*"))
    before = snapshot(run)
    img = image(tmp_path)
    attempts = [
        ["export", str(run), str(step / "model.safetensors")],
        ["export", str(run), str(run / "checkpoints" / "LATEST")],
        ["export", str(step), str(step / "new.onnx")],
        ["fewshot", "--from", str(run), "--data", "digits", "--out", str(step / "config.json")],
        ["eval", "--from", str(run), "--out", str(step)],
        ["explain", str(img), "--from", str(run), "--out", str(run / "checkpoints")],
        ["analyze", "--from", str(run), "--out", str(step / "analysis")],
        ["convert", str(run), str(step), "--to", "hf"],
    ]
    for args in attempts:
        for extra in ([], ["--overwrite"]):  # --overwrite does not open a checkpoint read
            code, out, err = run_cli([*args, *extra], capsys)
            assert code == 2 and "which this command reads" in err, (args, extra, err)
            assert "Traceback" not in err and "wrote" not in out
            assert len(err.strip().splitlines()) == 1
            assert snapshot(run) == before, args
    assert main(["inspect", str(run)]) == 0


def test_no_command_replaces_a_file_without_overwrite(
    run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("onnxscript")
    mine = tmp_path / "mine.onnx"
    mine.write_bytes(b"not vitkit's")
    code, out, err = run_cli(["export", str(run), str(mine), "--no-check"], capsys)
    assert code == 2 and "--overwrite" in err and mine.read_bytes() == b"not vitkit's"
    assert run_cli(["export", str(run), str(mine), "--no-check", "--overwrite"], capsys)[0] == 0
    assert mine.read_bytes() != b"not vitkit's"

    notes = tmp_path / "notes.json"
    notes.write_text("mine")
    fewshot = ["fewshot", "--from", str(run), "--data", "digits", "--shots", "1", "--seeds", "1"]
    code, _, err = run_cli([*fewshot, "--out", str(notes)], capsys)
    assert code == 2 and "--overwrite" in err and notes.read_text() == "mine"
    assert run_cli([*fewshot, "--out", str(notes), "--overwrite"], capsys)[0] == 0
    assert '"results"' in notes.read_text()

    # explain: an explicit --out holding these images' PNGs is refused; the default moves on.
    img = image(tmp_path)
    out_dir = tmp_path / "maps"
    out_dir.mkdir()
    (out_dir / "img_rollout.png").write_bytes(b"mine")
    code, _, err = run_cli(["explain", str(img), "--from", str(run), "--out", str(out_dir)], capsys)
    assert code == 2 and "img_rollout.png" in err and "--overwrite" in err
    assert (out_dir / "img_rollout.png").read_bytes() == b"mine"
    for expected in ("explain", "explain-2"):
        code, out, _ = run_cli(["explain", str(img), "--from", str(run)], capsys)
        assert code == 0 and str(run / expected / "img_rollout.png") in out
    # analyze with an explicit --out holding an analysis; eval --seeds' summary.json.
    an = tmp_path / "an"
    an.mkdir()
    (an / "analysis.json").write_text("mine")
    code, _, err = run_cli(["analyze", "--from", str(run), "--out", str(an)], capsys)
    assert code == 2 and "--overwrite" in err and (an / "analysis.json").read_text() == "mine"
    summary = tmp_path / "ev"
    summary.mkdir()
    (summary / "summary.json").write_text("mine")
    args = ["eval", "--from", str(run), str(run), "--out", str(summary)]
    code, _, err = run_cli(args, capsys)
    assert code == 2 and "summary.json" in err and not (summary / "0").exists()


def test_shards_never_replace_shards_without_overwrite(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "shards"
    args = ["shards", "digits", str(out), "--splits", "test"]
    assert run_cli(args, capsys)[0] == 0
    before = snapshot(out)
    code, _, err = run_cli([*args, "--no-shuffle"], capsys)
    assert code == 2 and "--overwrite" in err and snapshot(out) == before
    assert run_cli([*args, "--no-shuffle", "--overwrite"], capsys)[0] == 0
    assert snapshot(out) != before
    folder = tmp_path / "folder"  # never into the ImageFolder being read
    for cls in ("a", "b"):
        (folder / cls).mkdir(parents=True)
        Image.fromarray(np.zeros((8, 8), dtype=np.uint8)).save(folder / cls / "0.png")
    code, _, err = run_cli(["shards", str(folder), str(folder / "sh")], capsys)
    assert code == 2 and "which this command reads" in err and not (folder / "sh").exists()


# ----- item 2: non-finite weights are refused; NaN fails a parity check -----------------------


def test_export_refuses_nan_weights_and_the_check_fails_on_nan(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("onnxscript")
    pytest.importorskip("onnxruntime")
    from vitkit.engines.onnx_export import check_onnx, export_onnx

    model = vitkit.create_model(
        "Ti/4", image_size=16, num_classes=3, width=32, depth=1, num_heads=2, mlp_dim=64
    )
    with torch.no_grad():
        model.head.weight.fill_(float("nan"))
    save_checkpoint(tmp_path / "nan", model)
    code, out, err = run_cli(["export", str(tmp_path / "nan"), str(tmp_path / "m.onnx")], capsys)
    assert code == 2 and "NaN" in err and "head.weight" in err and "wrote" not in out
    assert not (tmp_path / "m.onnx").exists()
    # The parity check itself: onnxruntime's all-NaN logits are a failure, not a difference of 0.
    onnx = export_onnx(model, tmp_path / "direct.onnx")
    assert check_onnx(model, onnx) == float("inf")


# ----- item 3: every written file follows the umask -------------------------------------------


@pytest.mark.parametrize("umask", [0o022, 0o077])
def test_every_file_written_follows_the_umask(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], umask: int
) -> None:
    pytest.importorskip("onnxscript")
    old = os.umask(umask)
    try:
        run = tmp_path / "run"
        assert main(["train", *SHORT, "--out-dir", str(run)]) == 0
        assert main(["convert", str(run), str(tmp_path / "hf"), "--to", "hf"]) == 0
        assert main(["convert", str(run), str(tmp_path / "t.safetensors"), "--to", "timm"]) == 0
        assert main(["convert", str(run), str(tmp_path / "m.npz"), "--to", "npz"]) == 0
        assert main(["export", str(run), str(tmp_path / "m.onnx"), "--no-check"]) == 0
        assert main(["eval", "--from", str(run)]) == 0
        assert main(["explain", str(image(tmp_path)), "--from", str(run)]) == 0
        assert main(["shards", "digits", str(tmp_path / "sh"), "--splits", "test"]) == 0
    finally:
        os.umask(old)
    capsys.readouterr()
    files = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert len(files) > 20
    wrong = {str(p): oct(stat.S_IMODE(p.stat().st_mode)) for p in files}
    wrong = {k: v for k, v in wrong.items() if v != oct(0o666 & ~umask)}
    assert not wrong


@pytest.mark.parametrize(
    "args",
    [
        ["export", "{run}", "{dst}/x.onnx"],
        ["convert", "{run}", "{dst}/b.npz", "--to", "npz"],
        ["convert", "{run}", "{dst}/t.safetensors", "--to", "timm"],
        ["convert", "{run}", "{dst}/t.pth", "--to", "timm"],
        ["convert", "{run}", "{dst}/hf", "--to", "hf"],
    ],
)
def test_missing_parent_directories_are_made_by_every_writer(
    tiny_run: Path, tmp_path: Path, args: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """export and convert make a missing parent as train, eval and export --int8 do (they raised
    FileNotFoundError on the temporary file)."""
    dst = tmp_path / "missing" / "a"
    filled = [a.format(run=tiny_run, dst=dst) for a in args]
    code, _, err = run_cli(filled, capsys)
    assert code == 0, err
    assert Path(filled[2]).exists()
    assert sorted(p.name for p in dst.iterdir()) == [Path(filled[2]).name]  # no temporary left


@pytest.mark.parametrize(
    "where", ["{run}/checkpoints/{step}", "{run}/checkpoints/{step}/new", "{run}/sub"]
)
def test_a_run_is_never_made_inside_a_run_or_a_checkpoint(
    run: Path, where: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """``train --out-dir RUN/checkpoints/step_N`` wrote the new run into the old checkpoint, and
    ``eval --from`` it then evaluated the new model under the old checkpoint's name."""
    step = (run / "checkpoints" / "LATEST").read_text().strip()
    before = snapshot(run)
    out = where.format(run=run, step=step)
    code, _, err = run_cli(["train", *SHORT, "--out-dir", out], capsys)
    assert code != 0
    assert "a run directory is never made" in err, err
    assert snapshot(run) == before


@pytest.mark.parametrize("to", ["vitkit", "timm", "hf"])
def test_convert_never_writes_into_the_run_it_reads(
    run: Path, to: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """``convert RUN RUN --to vitkit --overwrite`` wrote config.json and the weights into the
    run directory it read: the run then read as a checkpoint."""
    before = snapshot(run)
    code, _, err = run_cli(["convert", str(run), str(run), "--to", to, "--overwrite"], capsys)
    assert code == 2 and "holds" in err and "checkpoint read" in err, err
    assert snapshot(run) == before


# ----- a broken symbolic link is something there: never replaced without --overwrite ---------


@pytest.mark.parametrize(
    "args",
    [
        ["export", "{run}", "{link}"],
        ["convert", "{run}", "{link}", "--to", "hf"],
        ["convert", "{run}", "{link}", "--to", "npz"],
        ["convert", "{run}", "{link}", "--to", "vitkit"],
        ["eval", "--from", "{run}", "--out", "{link}"],
        ["explain", "{img}", "--from", "{run}", "--out", "{link}"],
        ["analyze", "--from", "{run}", "--out", "{link}"],
        ["fewshot", "--from", "{run}", "--data", "digits", "--shots", "1", "--out", "{link}"],
        ["shards", "digits", "{link}", "--splits", "test"],
        [*["train", *SHORT], "--out-dir", "{link}"],
    ],
    ids=["export", "convert-hf", "convert-npz", "convert-vitkit", "eval", "explain", "analyze"]
    + ["fewshot", "shards", "train"],
)
def test_a_broken_link_is_never_replaced_without_overwrite(
    tiny_run: Path, tmp_path: Path, args: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """A dangling symbolic link as export's OUT was replaced by a regular file (rc 0): a path
    that exists as anything, a broken link included, is refused (a directory is never written
    through a broken link; a file replaces the link itself only with --overwrite)."""
    link = tmp_path / ("out.npz" if "npz" in args else "out.onnx" if "export" in args else "out")
    os.symlink(tmp_path / "nowhere", link)
    filled = [a.format(run=tiny_run, link=link, img=image(tmp_path)) for a in args]
    code, out, err = run_cli(filled, capsys)
    assert code == 2 and "Traceback" not in err and "symbolic link" in err, err
    assert len(err.strip().splitlines()) == 1, err
    assert link.is_symlink() and os.readlink(link) == str(tmp_path / "nowhere")
    assert not (tmp_path / "nowhere").exists()


def test_overwrite_replaces_a_broken_link_by_the_file_not_its_target(
    tiny_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for name, args in (("m.npz", ["--to", "npz"]), ("hf", ["--to", "hf"])):
        link = tmp_path / name
        os.symlink(tmp_path / f"nowhere-{name}", link)
        code, _, err = run_cli(["convert", str(tiny_run), str(link), *args, "--overwrite"], capsys)
        assert code == 0, err
        assert not link.is_symlink() and link.exists()
        assert not (tmp_path / f"nowhere-{name}").exists()
        assert [p.name for p in tmp_path.glob(".*")] == []
