"""A write that finds no room (vitkit.output_files.writing) is one line naming the destination
and the space needed, leaves no temporary file, and leaves what was there before untouched; a
training run that meets a full disk stops with that line and --resume goes on from its last
complete checkpoint.

The full disk is real: where the tests may mount one (root), a 3 MB tmpfs filled up to a few
KB, so every write meets ENOSPC through the kernel as on a full disk. Elsewhere (CI as another
user may not mount), the same commands run under a file-size limit (RLIMIT_FSIZE, SIGXFSZ
ignored): the kernel then fails the same write() calls with EFBIG, which vitkit handles the
same way (a loop filesystem or FUSE would need root too)."""

from __future__ import annotations

import contextlib
import errno
import os
import re
import resource
import shutil
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from vitkit.checkpoints import atomic_write_text
from vitkit.cli import main
from vitkit.train.metrics import MetricsLog

TINY = ["-o", "width=32", "-o", "depth=2", "-o", "num_heads=2", "-o", "mlp_dim=64"]
TRAIN = ["train", "--data", "digits", "--model", "Ti/2", *TINY, "--no-progress"]
TRAIN += ["--batch-size", "32", "--epochs", "1"]
ROOM = 16_000  # bytes left on the tmpfs: less than any checkpoint, ONNX file or PNG needs
LIMIT = 4096  # the file-size limit elsewhere: below every file but the smallest JSON


class SmallDisk:
    """A directory where writes find no room once :meth:`fill` has run (see the docstring)."""

    def __init__(self, path: Path, tmpfs: bool) -> None:
        self.path, self.tmpfs, self.limit = path, tmpfs, None
        self.filler = path / "filler"

    def fill(self, room: int | None = None) -> None:
        if self.tmpfs:
            free = shutil.disk_usage(self.path).free
            with open(self.filler, "wb") as f:
                os.posix_fallocate(f.fileno(), 0, free - (room or ROOM))
        else:
            self.limit = room or LIMIT

    def empty(self) -> None:
        self.filler.unlink(missing_ok=True)
        self.limit = None

    @contextlib.contextmanager
    def full(self) -> Iterator[None]:
        """Where the disk is not a tmpfs: the file-size limit while the block runs."""
        if self.limit is None:
            yield
            return
        soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
        handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (self.limit, hard))
        try:
            yield
        finally:
            resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
            signal.signal(signal.SIGXFSZ, handler)

    def run(self, args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
        with self.full():
            code = main(args)
        out, err = capsys.readouterr()
        return code, out, err

    def hidden(self) -> list[str]:
        """Every name under the disk that starts with '.' (every temporary name does)."""
        return sorted(str(p) for p in self.path.rglob(".*"))


def _can_mount() -> bool:
    return os.geteuid() == 0 and shutil.which("mount") is not None


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[SmallDisk]:
    mnt = tmp_path / "disk"
    mnt.mkdir()
    cmd = ["mount", "-t", "tmpfs", "-o", "size=3m,mode=0755", "tmpfs", str(mnt)]
    mounted = _can_mount() and subprocess.run(cmd, capture_output=True).returncode == 0
    try:
        yield SmallDisk(mnt, mounted)
    finally:
        if mounted:
            subprocess.run(["umount", "-l", str(mnt)], check=False)


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("full") / "run"
    assert main([*TRAIN, "--max-steps", "2", "--out-dir", str(out)]) == 0
    return out


def snapshot(path: Path) -> dict[str, bytes]:
    if path.is_file():
        return {"": path.read_bytes()}
    return {str(p.relative_to(path)): p.read_bytes() for p in path.rglob("*") if p.is_file()}


def check_one_line(disk: SmallDisk, code: int, err: str, dst: Path) -> None:
    errors = [line for line in err.splitlines() if line.startswith("vitkit: error:")]
    assert code == 2 and "Traceback" not in err and len(errors) == 1, err
    line = errors[0]
    assert line.startswith(f"vitkit: error: {dst}"), line  # the destination (or a file in it)
    if disk.tmpfs:
        assert "no space left on device" in line, line
        assert re.search(rf"{disk.path}\S* has [\d.]+ (bytes|KB|MB) free and ", line), line
        assert re.search(r"it needs about [\d.]+ (KB|MB)|not enough for it", line), line
    else:
        assert "file too large" in line, line
    assert disk.hidden() == [], disk.hidden()  # no temporary file or directory left


WRITERS = {
    "convert-vitkit": (["convert", "{run}", "{dst}", "--to", "vitkit"], "ckpt"),
    "convert-hf": (["convert", "{run}", "{dst}", "--to", "hf"], "hf"),
    "convert-npz": (["convert", "{run}", "{dst}", "--to", "npz"], "m.npz"),
    "convert-timm": (["convert", "{run}", "{dst}", "--to", "timm"], "m.safetensors"),
    "convert-pth": (["convert", "{run}", "{dst}", "--to", "timm"], "m.pth"),
    "export": (["export", "{run}", "{dst}", "--no-check"], "m.onnx"),
    "eval": (["eval", "--from", "{run}", "--out", "{dst}"], "ev"),
    "explain": (["explain", "{img}", "--from", "{run}", "--out", "{dst}"], "maps"),
}


@pytest.mark.parametrize("overwrite", [False, True], ids=["fresh", "overwrite"])
@pytest.mark.parametrize("writer", list(WRITERS))
def test_a_full_disk_is_one_line_no_litter_and_the_old_file_stays(
    disk: SmallDisk,
    run: Path,
    tmp_path: Path,
    writer: str,
    overwrite: bool,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Each writer ended in a traceback (SafetensorError ... os error 28, OSError: [Errno 28])
    and left its temporary file (.NAME.tmp-PID, .NAME.tmp-PID.onnx) behind."""
    if writer == "export":
        pytest.importorskip("onnxscript")
    template, name = WRITERS[writer]
    dst = disk.path / name
    img = tmp_path / "img.png"
    Image.fromarray(np.zeros((8, 8), dtype=np.uint8)).save(img)
    args = [a.format(run=run, dst=dst, img=img) for a in template]
    before: dict[str, bytes] = {}
    if overwrite:  # an earlier result, written while there was room
        code, _, err = disk.run(args, capsys)
        assert code == 0, err
        before = snapshot(dst)
        args.append("--overwrite")
    disk.fill()
    code, _, err = disk.run(args, capsys)
    check_one_line(disk, code, err, dst)
    if overwrite:
        assert snapshot(dst) == before
    else:  # nothing half-written under the destination's name
        assert not dst.exists() or (dst.is_dir() and snapshot(dst).keys() <= {"eval.json"})
    disk.empty()
    code, _, err = disk.run(args, capsys)  # with room again it is written
    assert code == 0, err
    assert disk.hidden() == []


def test_a_run_meeting_a_full_disk_stops_in_one_line_and_resumes(
    disk: SmallDisk, capsys: pytest.CaptureFixture[str]
) -> None:
    """A checkpoint that finds no room ends the run in one line; LATEST still names the last
    complete checkpoint, and --resume goes on from it to the run's end. (Under a file-size limit
    every checkpoint is as large as the first, so there the first one fails and --resume starts
    the run again from its first step.)"""
    out = disk.path / "run"
    args = [*TRAIN, "--max-steps", "6", "--ckpt-every", "2", "--keep-checkpoints", "1"]
    args += ["--out-dir", str(out)]
    if disk.tmpfs:
        code, _, err = disk.run([*TRAIN, "--max-steps", "2", "--out-dir", str(out)], capsys)
        assert code == 0, err  # (a finished run of 2 steps: its size says what one needs)
        step = out / "checkpoints" / "step_00000002"
        one = sum(p.stat().st_size for p in step.iterdir())
        shutil.rmtree(out)
        disk.fill(room=int(one * 1.5))  # the first checkpoint fits, a second beside it not
    else:
        disk.fill()
    code, _, err = disk.run(args, capsys)
    check_one_line(disk, code, err, out)
    latest = out / "checkpoints" / "LATEST"
    if disk.tmpfs:
        assert latest.read_text().strip() == "step_00000002"
        assert sorted(p.name for p in (out / "checkpoints").iterdir()) == [
            "LATEST",
            "step_00000002",
        ]
    else:
        assert not latest.exists()
    disk.empty()
    code, out_text, err = disk.run([*args, "--resume"], capsys)
    assert code == 0, err
    assert latest.read_text().strip() == "step_00000006"
    records = [r for r in MetricsLog(out / "metrics.jsonl").records() if "train_loss" in r]
    assert records and records[-1]["step"] == 6
    assert disk.hidden() == []


def test_a_record_that_finds_no_room_is_taken_back_and_said_in_one_line(
    disk: SmallDisk,
) -> None:
    """metrics.jsonl is appended to: a record cut short by a full disk is truncated away (the
    earlier records stay whole), and an atomic rewrite keeps the old file."""
    from vitkit.output_files import NoRoomError

    log = MetricsLog(disk.path / "metrics.jsonl")
    log.write({"step": 1, "train_loss": 1.0})
    before = log.path.read_bytes()
    big = {"step": 2, "note": "x" * 200_000}
    disk.fill(room=4096)
    if not disk.tmpfs:  # (the limit counts the file's size: the records so far and the new)
        disk.limit = len(before) + 4096
    with disk.full(), pytest.raises(NoRoomError) as e:
        log.write(big)
    assert str(log.path) in str(e.value) and e.value.code in (errno.ENOSPC, errno.EFBIG)
    assert log.path.read_bytes() == before
    with disk.full(), pytest.raises(NoRoomError):
        atomic_write_text(log.path, "y" * 200_000)
    assert log.path.read_bytes() == before and disk.hidden() == []
