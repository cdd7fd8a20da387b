"""The shard format: webdataset tar files and the ``shards.json`` index of a shard directory.

A shard is a plain POSIX tar file in the webdataset convention: the files of one sample are
consecutive and share a *key* (the path up to the first dot of the file name), their extension
says what they hold, e.g. ``000000042.png`` + ``000000042.cls`` (the label as ASCII digits).
Shards written by the ``webdataset`` package (``ShardWriter``/``TarWriter``) or by ``tar`` itself
read the same way.

A shard directory written by vitkit (``vitkit shards SRC OUT``, `vitkit.data.shards_write`) holds
``SPLIT-NNNNNN.tar`` files and ``shards.json``: the class names, channels, native image size and
the sample count of every shard, so that a reader knows each rank's share of an epoch without
opening a shard. A directory of tar files without ``shards.json`` (written elsewhere) is indexed
by reading it once. The index is read and written here, so that its fields are named in one
place; streaming is `vitkit.data.shards_read`.
"""

from __future__ import annotations

import json
import os
import posixpath
import re
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from vitkit.data import shards_remote as remote
from vitkit.data.arrays import DataInfo
from vitkit.errors import VitkitError
from vitkit.output_files import writing

INDEX = "shards.json"
FORMAT = "vitkit-shards"
IMAGE_KEYS = ("jpg", "jpeg", "png", "webp", "ppm", "pgm", "pbm", "bmp", "tif", "tiff", "gif")
LABEL_KEYS = ("cls", "cls2", "class", "label")
SPLITS = ("train", "val", "test")


# --- the index ------------------------------------------------------------------------------


@dataclass(frozen=True)
class ShardFile:
    path: Path | str  # a local file, or a URL in object storage
    samples: int
    size: int | None = None  # bytes, where shards.json records it


def is_shard_dir(spec: str | os.PathLike[str]) -> bool:
    """True for a directory written by `write_shards` or holding webdataset ``.tar`` files, and
    for a URL (shards in object storage, read through their ``shards.json``)."""
    if remote.is_remote(spec):
        return True
    p = Path(spec)
    return p.is_dir() and ((p / INDEX).is_file() or any(p.glob("*.tar")))


def read_index(root: str | os.PathLike[str]) -> dict[str, Any]:
    """The shard index of `root`: ``shards.json`` if present, else built by reading the tars
    (object storage: its ``shards.json`` only)."""
    path: Path | str
    try:
        if remote.is_remote(root):
            path = remote.join(str(root), INDEX)
            if not remote.exists(path):
                raise VitkitError(
                    f"{path}: not found; shards in object storage are read through the "
                    f"{INDEX} that 'vitkit shards SRC {root}' writes (are the bucket and the "
                    "prefix right?)"
                )
            index = json.loads(remote.read_bytes(path))
        else:
            root = Path(root)
            path = root / INDEX
            if not path.is_file():
                return _index_foreign(root)
            index = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise VitkitError(f"{path}: unreadable shard index ({e})") from None
    if not isinstance(index, dict) or index.get("format") != FORMAT:
        raise VitkitError(f"{path}: not a vitkit shard index (no format: {FORMAT})")
    for key in ("class_names", "channels", "splits"):
        if key not in index:
            raise VitkitError(f"{path}: shard index lacks '{key}'")
    return index


def shard_splits(root: str | os.PathLike[str]) -> tuple[str, ...]:
    return tuple(read_index(root)["splits"])


def shard_info(
    root: Path | str,
    index: dict[str, Any],
    image_size: int | tuple[int, int] | None,
    channels: int | None,
    default_size: int = 224,
) -> DataInfo:
    size = image_size if image_size is not None else index.get("image_size") or default_size
    h, w = (size, size) if isinstance(size, int) else size
    names = tuple(str(c) for c in index["class_names"])
    return DataInfo(
        # what a checkpoint records to find the data again
        name=str(root) if remote.is_remote(root) else str(Path(root).resolve()),
        num_classes=len(names),
        class_names=names,
        channels=int(channels or index["channels"]),
        image_size=(int(h), int(w)),
        allow_flip=bool(index.get("allow_flip", True)),
    )


def write_index(
    out_dir: str | os.PathLike[str],
    info: DataInfo,
    splits: dict[str, list[dict[str, Any]]],
    native_size: tuple[int, int] | None,
    source: str,
) -> Path:
    """Write ``shards.json`` (atomically) for the splits written into `out_dir` (a directory or
    a URL)."""
    index = {
        "format": FORMAT,
        "version": 1,
        "name": info.name,
        "source": source,
        "class_names": list(info.class_names),
        "channels": info.channels,
        "image_size": list(native_size) if native_size is not None else None,
        "allow_flip": info.allow_flip,
        "splits": splits,
    }
    if remote.is_remote(out_dir):  # (an object appears whole when its upload completes)
        remote.write_bytes(remote.join(str(out_dir), INDEX), json.dumps(index, indent=1).encode())
        return Path(INDEX)
    out = Path(out_dir)
    tmp = out / f".{INDEX}.tmp-{os.getpid()}"
    with writing(out / INDEX, tmp):  # any failure removes tmp; no room is one line
        tmp.write_text(json.dumps(index, indent=1))
        os.replace(tmp, out / INDEX)
    return out / INDEX


def _split_of(name: str) -> str:
    """The split a foreign shard's file name says it belongs to (default: train)."""
    stem = name.lower()
    for split in SPLITS:
        if re.match(rf"^{split}(ing|ation)?[-_.]", stem) or stem == f"{split}.tar":
            return split
    if re.match(r"^valid[-_.]", stem):
        return "val"
    return "train"


def _index_foreign(root: Path) -> dict[str, Any]:
    """Index a directory of webdataset tars written elsewhere (reads every shard once)."""
    splits: dict[str, list[dict[str, Any]]] = {}
    max_label = -1
    for path in sorted(root.glob("*.tar")):
        count = 0
        for sample in iter_tar_samples(path):
            if image_entry(sample) is None:
                continue
            max_label = max(max_label, label_of(sample, path))
            count += 1
        splits.setdefault(_split_of(path.name), []).append({"file": path.name, "samples": count})
    if not splits:
        raise VitkitError(f"{root}: no .tar shards")
    return {
        "format": FORMAT,
        "name": str(root.resolve()),
        "class_names": [str(i) for i in range(max_label + 1)],
        "channels": 3,
        "image_size": None,
        "allow_flip": True,
        "splits": splits,
    }


# --- reading tar files ----------------------------------------------------------------------


def iter_tar_samples(
    path: str | os.PathLike[str], fileobj: IO[bytes] | None = None
) -> Iterator[dict[str, Any]]:
    """The samples of a webdataset tar in file order: ``{"__key__": key, ext: bytes, ...}``.

    As webdataset: the key is the member's path up to the first dot of its file name and the
    extension (lower-cased) is the rest; consecutive members with one key form one sample.
    Directories, hidden files and names without an extension are ignored. ``fileobj``: the
    shard's bytes already fetched (``path`` then only names it).
    """
    current: dict[str, Any] | None = None
    try:
        with tarfile.open(None if fileobj else path, "r|*", fileobj=fileobj) as tar:
            for member in tar:
                if not member.isfile():
                    continue
                dirname, base = posixpath.split(member.name)
                if base.startswith(".") or "." not in base:
                    continue
                stem, ext = base.split(".", 1)
                key = posixpath.join(dirname, stem)
                f = tar.extractfile(member)
                data = f.read() if f is not None else b""
                if current is None or current["__key__"] != key:
                    if current is not None:
                        yield current
                    current = {"__key__": key, "__url__": str(path)}
                current[ext.lower()] = data
    except (tarfile.TarError, EOFError, OSError) as e:
        raise VitkitError(f"{path}: unreadable tar shard ({type(e).__name__}: {e})") from None
    if current is not None:
        yield current


def image_entry(sample: dict[str, Any]) -> bytes | None:
    for key in IMAGE_KEYS:
        if key in sample:
            return sample[key]
    return None


def label_of(sample: dict[str, Any], path: str | os.PathLike[str]) -> int:
    for key in LABEL_KEYS:
        if key in sample:
            try:
                return int(sample[key].decode().strip())
            except (UnicodeDecodeError, ValueError):
                break
    if "json" in sample:
        try:
            meta = json.loads(sample["json"])
            if isinstance(meta, dict) and "label" in meta:
                return int(meta["label"])
        except (ValueError, TypeError):
            pass
    raise VitkitError(
        f"{path}: sample '{sample['__key__']}' has no integer label (.cls, or .json with 'label')"
    )


__all__ = [
    "FORMAT",
    "IMAGE_KEYS",
    "INDEX",
    "LABEL_KEYS",
    "SPLITS",
    "ShardFile",
    "image_entry",
    "is_shard_dir",
    "iter_tar_samples",
    "label_of",
    "read_index",
    "shard_info",
    "shard_splits",
    "write_index",
]
