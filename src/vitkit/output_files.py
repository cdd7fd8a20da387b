"""Writing files: where a command may write, and the mode a written file gets.

One rule for every command that writes (:func:`check_destination`): nothing is ever written
into a checkpoint that is being read (the checkpoint's directory or file, and for a run's
checkpoint the run's whole ``checkpoints/``), ``--overwrite`` or not; an existing file is
replaced only with ``--overwrite``. Every file is written under a temporary name and renamed
into place (:func:`publish`) with the mode the umask gives a new file (``0o666 & ~umask``):
``tempfile.mkstemp`` and some writers (safetensors) create ``0o600`` whatever the umask, which
would keep a run from the other users of a shared machine.

A write that finds no room (a full disk or quota, a file-size limit) goes through
:func:`writing`: its temporary file or directory is removed and the error is one line naming the
destination, the space free there and the space the write needs; what was there before stays.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import stat
from collections.abc import Iterable, Iterator
from pathlib import Path

from vitkit.errors import VitkitError

HINT = "choose another destination, or pass --overwrite (it replaces only the files written)"


def file_mode() -> int:
    """The mode ``open(path, "w")`` gives a new file under the current umask."""
    mask = os.umask(0o022)
    os.umask(mask)
    return 0o666 & ~mask


def fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def set_file_mode(path: str | os.PathLike[str]) -> None:
    """Give a file just written the umask's mode (see the module's docstring)."""
    os.chmod(path, file_mode())


def publish(tmp: str | os.PathLike[str], dst: str | os.PathLike[str]) -> Path:
    """Move the finished file ``tmp`` to ``dst``: the umask's mode, fsynced, renamed (never
    over a device, FIFO or socket: :func:`check_kind`)."""
    check_kind(dst)
    set_file_mode(tmp)
    with open(tmp, "rb") as f:
        os.fsync(f.fileno())
    os.replace(tmp, dst)
    fsync_dir(Path(dst).parent)
    return Path(dst)


def read_paths(read: str | os.PathLike[str]) -> list[Path]:
    """What a write must never enter while the checkpoint ``read`` is read: the checkpoint
    itself and, for a run's checkpoint (``RUN/checkpoints/step_N``), ``RUN/checkpoints``."""
    p = Path(read).resolve()
    return [p, p.parent] if p.parent.name == "checkpoints" else [p]


def _kind(st: os.stat_result) -> str:
    for test, name in (
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISFIFO, "a named pipe (FIFO)"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(st.st_mode):
            return name
    return "not a regular file"


def check_kind(path: str | os.PathLike[str]) -> None:
    """Refuse to replace ``path`` if it exists (itself, or where its symbolic link leads) and is
    neither a regular file nor a directory: a device, a FIFO or a socket is never turned into a
    regular file, ``--overwrite`` or not."""
    p = Path(path)
    for st in _stats(p):
        if not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode) or stat.S_ISLNK(st.st_mode)):
            raise VitkitError(
                f"{p}: is {_kind(st)}; vitkit writes only regular files and directories and "
                "never replaces anything else (--overwrite or not): choose another destination"
            )


def _stats(p: Path) -> list[os.stat_result]:
    out = []
    for follow in (False, True):
        # absent, a dangling link, a name the system refuses: nothing there to protect
        with contextlib.suppress(OSError, ValueError):
            out.append(os.stat(p, follow_symlinks=follow))
    return out


# A write that found no room: the disk (or the user's quota) is full, or the file is larger than
# the size limit (RLIMIT_FSIZE, ``ulimit -f``) or the filesystem allows.
NO_ROOM = {errno.ENOSPC: "no space left", errno.EDQUOT: "disk quota exceeded"}
TOO_LARGE = {errno.EFBIG: "file too large"}
# How writers that are not Python's own (safetensors' Rust, onnx's C++) word the same errors.
_NO_ROOM_WORDS = {
    errno.ENOSPC: ("no space left on device", "os error 28", "code: 28,", "storagefull"),
    errno.EDQUOT: ("disk quota exceeded", "os error 122", "code: 122,", "quotaexceeded"),
    errno.EFBIG: ("file too large", "os error 27", "code: 27,", "filetoolarge"),
}


class NoRoomError(VitkitError):
    """A write that found no room (see :func:`writing`): ``code`` is its errno."""

    def __init__(self, message: str, code: int, need: int | None) -> None:
        super().__init__(message)
        self.code, self.need = code, need


def no_room_code(e: BaseException) -> int | None:
    """ENOSPC, EDQUOT or EFBIG if ``e`` (or an error it was raised from) is a write that found
    no room, in Python's words or a native library's; else None."""
    seen: set[int] = set()
    cur: BaseException | None = e
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if isinstance(cur, NoRoomError):
            return cur.code
        if isinstance(cur, VitkitError):  # a refusal, whatever its words
            return None
        if isinstance(cur, OSError) and cur.errno in {**NO_ROOM, **TOO_LARGE}:
            return cur.errno
        text = str(cur).lower()
        for code, words in _NO_ROOM_WORDS.items():
            if any(w in text for w in words):
                return code
        cur = cur.__cause__ or cur.__context__
    return None


def disk_bytes(n: int) -> int:
    """The disk space a file of ``n`` bytes takes: whole 4 KB blocks."""
    return -(-n // 4096) * 4096


def size_text(n: float) -> str:
    for unit in ("bytes", "KB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1000
    raise AssertionError  # (unreachable)


def _existing_dir(p: Path) -> Path:
    d = p.absolute().parent
    while not d.is_dir() and d != d.parent:
        d = d.parent
    return d


def _remove(tmp: Path) -> None:
    if tmp.is_dir() and not tmp.is_symlink():
        shutil.rmtree(tmp, ignore_errors=True)
    else:
        with contextlib.suppress(OSError):
            tmp.unlink()


def no_room_message(dst: str | os.PathLike[str], code: int, need: int | None) -> str:
    """The one line of a write of ``dst`` that found no room: the space free and needed."""
    where = _existing_dir(Path(dst))
    try:
        free = shutil.disk_usage(where).free
    except OSError:
        free = None
    if need and (free is None or need > free):
        needs = f"it needs about {size_text(need)}"
    else:  # (the estimate fell short: headers, blocks, a writer's own temporary files)
        needs = "that is not enough for it"
    has = f"{where} has {size_text(free)} free" if free is not None else f"{where} is full"
    if code in TOO_LARGE:
        limit = f"about {size_text(need)}" if need else "it"
        return (
            f"{dst}: file too large: the file-size limit (ulimit -f) or the filesystem does not "
            f"allow {limit}; nothing was written (raise the limit or choose another destination)"
        )
    full = "disk quota exceeded" if code == errno.EDQUOT else "no space left on device"
    return (
        f"{dst}: {full}: {has} and {needs}; nothing was written (free space or choose another "
        "destination)"
    )


@contextlib.contextmanager
def writing(
    dst: str | os.PathLike[str],
    tmp: str | os.PathLike[str] | None = None,
    *,
    need: int | None = None,
) -> Iterator[None]:
    """Around the write of ``dst`` through the temporary file or directory ``tmp``: on any
    failure (an interrupt included) ``tmp`` is removed, and a write that found no room (a full
    disk or quota, ENOSPC / EDQUOT, or a file-size limit, EFBIG: :func:`no_room_code`) becomes
    one :class:`NoRoomError` line naming ``dst``, the space free there and ``need``, the bytes
    the write needs (when known). ``dst`` itself is touched only by the rename at the end, so
    what was there before stays. A :class:`NoRoomError` raised inside (a nested write) is said
    again for ``dst``."""
    try:
        yield
    except BaseException as e:
        if tmp is not None:
            _remove(Path(tmp))
        code = no_room_code(e) if isinstance(e, Exception) else None
        if code is None:
            raise
        if isinstance(e, NoRoomError) and e.need is not None:
            need = need or e.need
        raise NoRoomError(no_room_message(dst, code, need), code, need) from None


@contextlib.contextmanager
def all_or_none(out: str | os.PathLike[str], names: Iterable[str]) -> Iterator[None]:
    """Around a command that writes the files ``names`` into the directory ``out`` one by one:
    if it fails part-way (a full disk: :func:`writing`), the files it had written are removed
    again, and ``out`` too if it made it, so that the same command can simply be run again
    (files that were there before it started are not touched)."""
    out, names = Path(out), list(names)
    made = not os.path.lexists(out)
    there = {n for n in names if os.path.lexists(out / n)}
    try:
        yield
    except Exception:
        for n in set(names) - there:
            with contextlib.suppress(OSError):
                (out / n).unlink()
        if made:
            with contextlib.suppress(OSError):
                out.rmdir()  # (only if empty)
        raise


def check_writable(dst: str | os.PathLike[str], *, inside: bool = False) -> None:
    """Refuse, before any work, a destination whose nearest existing directory this user
    cannot write (a read-only or immutable directory): one line naming it, not a traceback.
    ``inside``: files are written into the directory ``dst`` only (else ``dst`` itself is
    written beside, under a temporary name, and renamed: its parent must be writable too)."""
    p = Path(dst).absolute()
    dirs = [p] if p.is_dir() else []
    if not (inside and dirs):
        d = p.parent
        while not d.exists() and d != d.parent:
            d = d.parent
        dirs.append(d)
    for d in dirs:
        if d.is_dir() and not os.access(d, os.W_OK | os.X_OK):
            raise VitkitError(
                f"{dst}: cannot write into {d} (permission denied: read-only, immutable or "
                "another user's): choose another destination"
            )


def check_destination(
    dst: str | os.PathLike[str],
    *,
    reads: Iterable[str | os.PathLike[str]] = (),
    writes: Iterable[str] | None = None,
    overwrite: bool = False,
    flag: str = "--overwrite",
) -> None:
    """Refuse ``dst`` if it is (or lies inside) a checkpoint in ``reads`` (always), or if
    writing it would replace an existing file (unless ``overwrite``). ``writes``: the names the
    command writes inside the directory ``dst``; None: ``dst`` is written as one file, or a
    whole directory that must then be absent or empty."""
    dst = Path(dst)
    target = dst.resolve()
    writes = None if writes is None else list(writes)
    check_kind(dst)
    for name in writes or ():
        check_kind(dst / name)
    if writes is not None and dst.is_symlink() and not dst.exists():
        raise VitkitError(  # (files are written into dst: there is no directory to write into)
            f"{dst}: is a broken symbolic link (to {_target(dst)}); vitkit writes no directory "
            "through it (--overwrite or not): choose another destination or remove the link"
        )
    for read in reads:
        for p in read_paths(read):
            if target == p or p in target.parents:
                raise VitkitError(
                    f"{dst}: is {p} or inside it, which this command reads; nothing is written "
                    f"into a checkpoint or dataset being read ({flag} or not): choose another "
                    "destination"
                )
    check_writable(dst, inside=writes is not None)
    if overwrite:
        return
    if writes is not None:
        taken = [name for name in writes if os.path.lexists(dst / name)]
        if taken:
            more = f" (and {len(taken) - 1} more of the files it writes)" if len(taken) > 1 else ""
            raise VitkitError(f"{dst}: already holds {taken[0]}{more}; {HINT}")
        return
    if dst.is_dir() and any(dst.iterdir()):
        raise VitkitError(f"{dst}: exists and is not empty; {HINT}")
    if os.path.lexists(dst) and not dst.is_dir():  # a file, or a link (a broken one too)
        raise VitkitError(f"{dst}: exists{_link_to(dst)}; {HINT}")


def _target(p: Path) -> str:
    try:
        return os.readlink(p)
    except OSError:
        return "?"


def _link_to(p: Path) -> str:
    """', a symbolic link to TARGET (which does not exist)' for a link, else ''."""
    if not p.is_symlink():
        return ""
    try:
        target = os.readlink(p)
    except OSError:
        return " (a symbolic link)"
    missing = "" if p.exists() else ", which does not exist"
    return f" (a symbolic link to {target}{missing})"


def fresh_directory(
    out: Path, *, given: bool, overwrite: bool, writes: Iterable[str], reads: Iterable[Path] = ()
) -> Path:
    """Where a command writes the files ``writes``: ``out``, unless an earlier result is
    there; then the first free ``out-2``, ``out-3``, ... for a default place (not ``given``),
    while a ``given`` one is refused unless ``overwrite``. Never inside a checkpoint in
    ``reads``."""
    names = list(writes)
    reads = list(reads)
    check_destination(out, reads=reads, writes=names, overwrite=overwrite or not given)

    def taken(d: Path) -> bool:
        return any(os.path.lexists(d / n) for n in names)

    if overwrite or given or not taken(out):
        return out
    n = 2
    while taken(out.with_name(f"{out.name}-{n}")):
        n += 1
    return out.with_name(f"{out.name}-{n}")


def _holds_run_or_checkpoint(d: Path) -> str:
    """What ``d`` is, if it is a run directory or a checkpoint ("" if neither)."""
    if (d / "checkpoints" / "LATEST").is_file() or (d / "train_config.json").is_file():
        return "a run directory"
    weights = ("model.safetensors", "dcp")
    if (d / "config.json").is_file() and any((d / w).exists() for w in weights):
        return "a checkpoint"
    return ""


def check_run_dir(out: str | os.PathLike[str]) -> None:
    """Refuse a new run's directory that is a checkpoint, or lies inside a checkpoint or a run
    directory (``RUN/checkpoints/step_N``): the new run would be read back under the old one's
    name. (``out`` itself holding a run is the trainer's to judge: refused unless resumed.)"""
    target = Path(out).resolve()
    check_kind(out)
    if Path(out).is_symlink() and not Path(out).exists():
        raise VitkitError(
            f"{out}: is a broken symbolic link (to {_target(Path(out))}); a run directory is never "
            "made through one: choose another --out-dir or remove the link"
        )
    if _holds_run_or_checkpoint(target) == "a checkpoint":
        raise VitkitError(f"{out}: is a checkpoint; a run directory is never made in one")
    for parent in target.parents:
        kind = _holds_run_or_checkpoint(parent)
        if kind:
            raise VitkitError(
                f"{out}: lies inside {parent}, {kind}; a run directory is never made inside "
                "a run or a checkpoint: choose another --out-dir"
            )
    check_writable(out, inside=True)


__all__ = [
    "all_or_none",
    "check_destination",
    "check_kind",
    "check_run_dir",
    "check_writable",
    "disk_bytes",
    "file_mode",
    "NoRoomError",
    "no_room_code",
    "no_room_message",
    "writing",
    "fresh_directory",
    "fsync_dir",
    "publish",
    "read_paths",
    "set_file_mode",
]
