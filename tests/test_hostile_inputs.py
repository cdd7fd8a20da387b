"""Hostile and mistaken inputs end in one line, and nothing that is not a regular file is ever
replaced: devices, FIFOs and sockets as destinations, places the user cannot write, label
lists shorter than the head, JSON nested past Python's parser, file names that are not UTF-8,
image formats outside the allow-list, unknown fine-tuning options, a grid given to a bare EVA
file, a patch that does not tile the data, an IPv6 listen address, a run inside a run."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import stat
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import vitkit
from vitkit import create_model
from vitkit.checkpoints import save_checkpoint
from vitkit.cli import main
from vitkit.errors import VitkitError
from vitkit.output_files import check_destination

NAMES = ("a", "b", "c", "d", "e")


def run_cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(args)
    out, err = capsys.readouterr()
    return code, out, err


def tiny_checkpoint(path: Path) -> Path:
    model = create_model(
        "Ti/4", image_size=(16, 16), width=32, depth=2, num_heads=2, mlp_dim=64, num_classes=5
    )
    return save_checkpoint(path, model.eval(), class_names=NAMES)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_checkpoint(tmp_path_factory.mktemp("hostile") / "ck")


def image(path: Path) -> Path:
    Image.fromarray(np.full((16, 16, 3), 128, dtype=np.uint8)).save(path, format="PNG")
    return path


def one_line_error(code: int, err: str) -> str:
    assert code == 2, err
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.startswith("vitkit: error: ")]
    assert len(lines) == 1, err
    return lines[0]


# ----- devices, FIFOs and sockets are never replaced ------------------------------------------


def test_export_and_convert_never_replace_a_fifo_even_with_overwrite(
    ckpt: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fifo = tmp_path / "pipe.onnx"
    os.mkfifo(fifo)
    link = tmp_path / "link.onnx"  # a link to the FIFO: the FIFO is what would be replaced
    link.symlink_to(fifo)
    npz_fifo = tmp_path / "pipe.npz"
    os.mkfifo(npz_fifo)
    attempts = [
        ["export", str(ckpt), str(fifo), "--overwrite", "--no-check"],
        ["export", str(ckpt), str(link), "--overwrite", "--no-check"],
        ["convert", str(ckpt), str(npz_fifo), "--to", "npz", "--overwrite"],
    ]
    for args in attempts:
        line = one_line_error(*run_cli(args, capsys)[::2])
        assert "named pipe (FIFO)" in line and "never replaces" in line, line
    assert stat.S_ISFIFO(os.stat(fifo).st_mode) and stat.S_ISFIFO(os.stat(npz_fifo).st_mode)
    assert link.is_symlink() and os.readlink(link) == str(fifo)


def test_no_writer_replaces_a_socket_or_a_fifo_inside_its_directory(tmp_path: Path) -> None:
    short = Path("/tmp") / f"vk-sock-{os.getpid()}"  # (a socket's path is at most 107 bytes)
    s = socket.socket(socket.AF_UNIX)
    try:
        s.bind(str(short))
        with pytest.raises(VitkitError, match="is a socket"):
            check_destination(short, overwrite=True)
    finally:
        s.close()
        short.unlink(missing_ok=True)
    out = tmp_path / "engine"
    out.mkdir()
    os.mkfifo(out / "model.onnx")
    with pytest.raises(VitkitError, match="named pipe"):
        check_destination(out, writes=["engine.json", "model.onnx"], overwrite=True)


# ----- a place the user cannot write: one line, before any work --------------------------------


@pytest.fixture
def read_only_dir(tmp_path: Path) -> Iterator[Callable[[Path], Path]]:
    """Makes a directory this process cannot write: 0555 for a user; for root (whom 0555 does
    not stop) the immutable attribute. Skips where neither holds on this file system."""
    made: list[Path] = []

    def make(d: Path) -> Path:
        if os.geteuid() != 0:
            d.chmod(0o555)
        elif shutil.which("chattr") is None:
            pytest.skip("running as root without chattr: no directory is read-only to root here")
        else:
            done = subprocess.run(["chattr", "+i", str(d)], capture_output=True)
            if done.returncode:
                pytest.skip(f"chattr +i does not work on this file system: {done.stderr!r}")
        made.append(d)
        try:
            (d / "probe").touch()
        except PermissionError:
            return d
        pytest.skip(f"{d} stays writable to this user")
        return d  # (not reached)

    yield make
    for d in made:
        if os.geteuid() == 0:
            subprocess.run(["chattr", "-i", str(d)], check=False)
        else:
            d.chmod(0o755)


def test_writing_where_the_user_cannot_is_one_line_naming_the_place(
    ckpt: Path,
    tmp_path: Path,
    read_only_dir: Callable[[Path], Path],
    capsys: pytest.CaptureFixture[str],
) -> None:
    img = image(tmp_path / "img.png")
    ro = tmp_path / "ro"
    ro.mkdir()
    inner = tiny_checkpoint(ro / "ck")  # a checkpoint in a read-only place: explain's default
    read_only_dir(ro)
    attempts = [
        ["convert", str(ckpt), str(ro / "out"), "--to", "hf"],
        ["convert", str(ckpt), str(ro / "out.npz"), "--to", "npz"],
        ["export", str(ckpt), str(ro / "m.onnx"), "--no-check"],
        ["explain", str(img), "--from", str(ckpt), "--out", str(ro / "maps")],
        ["explain", str(img), "--from", str(inner)],
        ["train", "--data", "digits", "--model", "Ti/2", "--out-dir", str(ro / "run")],
    ]
    for args in attempts:
        code, out, err = run_cli(args, capsys)
        line = one_line_error(code, err)
        assert "permission denied" in line and str(ro) in line, (args, line)
        assert "training" not in err  # refused before the banner
    assert sorted(p.name for p in ro.iterdir()) == ["ck"]


# ----- files that lie or attack ----------------------------------------------------------------


def timm_folder(ckpt: Path, dst: Path, capsys: pytest.CaptureFixture[str]) -> Path:
    assert run_cli(["convert", str(ckpt), str(dst), "--to", "timm"], capsys)[0] == 0
    return dst


def test_label_names_shorter_than_the_head_are_refused_at_load(
    ckpt: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = timm_folder(ckpt, tmp_path / "timm", capsys)
    config = json.loads((folder / "config.json").read_text())
    assert config["label_names"] == list(NAMES)
    config["label_names"] = ["a", "b"]
    (folder / "config.json").write_text(json.dumps(config))
    img = image(tmp_path / "img.png")
    for args in (["predict", str(img), "--from", str(folder)], ["inspect", str(folder)]):
        line = one_line_error(*run_cli(args, capsys)[::2])
        assert "2 label_names for a head of 5 outputs" in line, line
    pytest.importorskip("fastapi")
    pytest.importorskip("uvicorn")
    line = one_line_error(*run_cli(["serve", str(folder), "--dry-run"], capsys)[::2])
    assert "2 label_names for a head of 5 outputs" in line, line


def test_a_config_nested_past_the_parser_is_one_line(
    ckpt: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = timm_folder(ckpt, tmp_path / "timm", capsys)
    (folder / "config.json").write_text("[" * 100_000 + "]" * 100_000)
    line = one_line_error(*run_cli(["inspect", str(folder)], capsys)[::2])
    assert "config.json: unreadable JSON (nested too deeply)" in line
    with pytest.raises(VitkitError, match="nested too deeply"):
        vitkit.load(folder)
    native = tmp_path / "native"
    shutil.copytree(ckpt, native)
    (native / "config.json").write_text('{"a":' * 100_000 + "1" + "}" * 100_000)
    with pytest.raises(VitkitError, match="nested too deeply"):
        vitkit.load(native)


def test_explain_draws_an_image_whose_name_is_not_utf8(
    ckpt: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    raw = os.fsencode(tmp_path) + b"/caf\xe9.png"  # Latin-1: not UTF-8
    with contextlib.suppress(OSError):
        image(Path(os.fsdecode(raw)))
    if not os.path.exists(raw):
        pytest.skip("this file system refuses names that are not UTF-8")
    out = tmp_path / "maps"
    code, stdout, err = run_cli(
        ["explain", os.fsdecode(raw), "--from", str(ckpt), "--out", str(out)], capsys
    )
    assert code == 0, err
    assert (out / os.fsdecode(b"caf\xe9_rollout.png")).is_file()
    assert "caf\ufffd.png: " in stdout and "Traceback" not in err
    code, stdout, err = run_cli(["predict", os.fsdecode(raw), "--from", str(ckpt)], capsys)
    assert code == 0 and "caf\ufffd.png: " in stdout, err


def test_eps_and_other_formats_outside_the_allow_list_are_never_parsed(
    ckpt: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    eps = tmp_path / "img.eps"
    Image.new("RGB", (16, 16)).save(eps, format="EPS")
    ppm = tmp_path / "img.ppm"
    Image.new("RGB", (16, 16)).save(ppm, format="PPM")  # PIL reads it: the allow-list refuses
    for path in (eps, ppm):
        for cmd in ("predict", "explain"):
            line = one_line_error(*run_cli([cmd, str(path), "--from", str(ckpt)], capsys)[::2])
            assert str(path) in line and "PNG, JPEG, WEBP, BMP, GIF, TIFF" in line, line


# ----- clearer refusals ------------------------------------------------------------------------


def test_finetune_names_an_unknown_option_as_every_command_does(
    ckpt: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["finetune", "--from", str(ckpt), "--data", "digits", "-o", "bogus=1"]
    line = one_line_error(*run_cli([*args, "--out-dir", str(tmp_path / "r")], capsys)[::2])
    assert line.endswith("unknown model option(s): bogus"), line
    line = one_line_error(
        *run_cli(
            ["predict", str(image(tmp_path / "i.png")), "--from", str(ckpt), "-o", "bogus=1"],
            capsys,
        )[::2]
    )
    assert line.endswith("unknown model option(s): bogus"), line


def test_a_bare_eva_file_says_it_takes_no_grid_and_the_folder_it_suggests_reads(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from references import import_reference

    timm = import_reference("timm")
    from safetensors.torch import save_file

    model = timm.create_model(
        "eva02_tiny_patch14_224", pretrained=False, img_size=(56, 42), num_classes=5, depth=1
    )
    bare = tmp_path / "eva02.safetensors"
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(bare))
    for extra in (["-o", "grid=4,3"], []):
        line = one_line_error(*run_cli(["inspect", str(bare), *extra], capsys)[::2])
        assert "a bare EVA / EVA-02 state dict takes no grid" in line, line
        assert "model_args.img_size" in line and "shape" not in line, line
    with pytest.raises(VitkitError, match="takes no grid"):
        vitkit.load(bare, grid=(4, 3))
    folder = tmp_path / "folder"  # what the message says to do
    folder.mkdir()
    shutil.copy(bare, folder / "model.safetensors")
    hub = {"architecture": "eva02_tiny_patch14_224", "num_classes": 5}
    hub["model_args"] = {"img_size": [56, 42], "depth": 1}
    (folder / "config.json").write_text(json.dumps(hub))
    code, out, err = run_cli(["inspect", str(folder)], capsys)
    assert code == 0 and "56x42 (grid 4x3)" in out, err


def test_a_patch_that_does_not_tile_the_data_says_the_fix_and_the_fix_works(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    line = one_line_error(
        *run_cli(["train", "--data", "shapes", "--out-dir", str(tmp_path / "a")], capsys)[::2]
    )
    assert line.endswith(
        "image height 32 is not a positive multiple of the patch 7: pass -o patch_size=4 or "
        "--image-size 28"
    ), line
    small = ["-o", "width=16", "-o", "depth=1", "-o", "num_heads=2", "-o", "mlp_dim=32"]
    small += [
        "--max-steps",
        "1",
        "--epochs",
        "1",
        "--no-progress",
        "--train-size",
        "64",
        "--batch-size",
        "32",
    ]
    for fix in (["-o", "patch_size=4"], ["--image-size", "28"]):
        out_dir = tmp_path / fix[-1].replace("=", "")
        code, _, err = run_cli(
            ["train", "--data", "shapes", *fix, *small, "--out-dir", str(out_dir)], capsys
        )
        assert code == 0, err


def test_an_ipv6_host_is_written_as_a_url() -> None:
    from vitkit.serve.workers import http_url

    assert http_url("::", 8000) == "http://[::]:8000"
    assert http_url("::1", 80) == "http://[::1]:80"
    assert http_url("127.0.0.1", 8000) == "http://127.0.0.1:8000"


def test_serve_dry_run_on_ipv6_prints_a_url(ckpt: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("fastapi")
    pytest.importorskip("uvicorn")
    code, out, err = run_cli(
        ["serve", str(ckpt), "--host", "::", "--port", "8123", "--dry-run"], capsys
    )
    assert code == 0, err
    (serving,) = [line for line in out.splitlines() if line.startswith("would serve")]
    assert serving.endswith(" on http://[::]:8123"), out


def test_a_run_inside_a_run_is_refused_before_the_banner(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "checkpoints" / "LATEST").write_text("step_1\n")
    out_dir = run / "checkpoints" / "step_1"
    code, out, err = run_cli(
        ["train", "--data", "digits", "--model", "Ti/2", "--out-dir", str(out_dir)], capsys
    )
    line = one_line_error(code, err)
    assert "lies inside" in line and "a run directory" in line, line
    assert "->" not in err and "training" not in err.replace(line, ""), err


def test_a_junk_torch_file_is_one_line_whatever_the_bytes(tmp_path):
    """Random bytes named .pt reach torch.load's legacy reader, which raised KeyError,
    IndexError or struct.error (a traceback from every reading command): one line instead."""
    import random

    rng = random.Random(0)
    path = tmp_path / "junk.pt"
    for i in range(120):
        body = bytes(rng.getrandbits(8) for _ in range(rng.choice([1, 2, 5, 17, 100])))
        path.write_bytes((b"\x80\x02" if i % 3 == 0 else b"") + body)
        with pytest.raises(VitkitError, match="junk.pt"):
            vitkit.load(path)


# ----- a file this user may not read: "permission denied", not "no such file" ----------------


@contextlib.contextmanager
def as_another_user() -> Iterator[None]:
    """A user whom a mode-000 file stops: this one where it is not root; for root (whom 0000
    does not stop), the effective user set to nobody for the block (the real one stays root, so
    it comes back after)."""
    if os.geteuid() != 0:
        yield
        return
    import pwd

    try:
        nobody = pwd.getpwnam("nobody").pw_uid
    except KeyError:
        pytest.skip("running as root with no 'nobody' user to become")
    os.seteuid(nobody)
    try:
        yield
    finally:
        os.seteuid(0)


def test_a_file_the_user_may_not_read_is_said_to_be_so(
    ckpt: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A root-owned mode-600 model.safetensors read as another user was reported "No such file
    or directory" (safetensors' words for it): the line says permission denied."""
    import tempfile

    base = Path(tempfile.mkdtemp(prefix="vitkit-perm-"))  # (pytest's own is root's 0700)
    try:
        base.chmod(0o755)
        own = base / "ck"
        shutil.copytree(ckpt, own)
        bare = base / "w.safetensors"
        shutil.copy(own / "model.safetensors", bare)
        for f in (own / "model.safetensors", bare):
            f.chmod(0o000)
        for args, path in ((["inspect", str(own)], own / "model.safetensors"),
                           (["inspect", str(bare)], bare)):  # fmt: skip
            main(args)  # (as this user first: whatever the command imports is imported)
            capsys.readouterr()
            with as_another_user():
                code = main(args)
            err = capsys.readouterr().err
            assert code == 2 and "Traceback" not in err, err
            assert f"{path}: " in err and "permission denied" in err, err
            assert "No such file" not in err, err
    finally:
        for f in base.rglob("*"):
            f.chmod(0o755 if f.is_dir() else 0o644)
        shutil.rmtree(base)
