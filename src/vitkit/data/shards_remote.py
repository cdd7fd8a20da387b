"""Shards in object storage: ``s3://BUCKET/PREFIX/``, ``gs://...``, ``https://...`` through
fsspec (the ``cloud`` extra: fsspec + s3fs; gcsfs for ``gs://``).

Credentials come from where the storage's own tools find them (for S3: ``AWS_ACCESS_KEY_ID`` /
``AWS_SECRET_ACCESS_KEY`` / ``AWS_SESSION_TOKEN``, ``AWS_PROFILE`` and ``~/.aws``; another
endpoint, e.g. MinIO or a local server: ``AWS_ENDPOINT_URL``); vitkit never takes them on its
command line and never writes them into a message. A shard is read whole (``read_shard``),
retried where a retry can help (a dropped connection, a throttled or failed request, a short
read against the size ``shards.json`` records) and refused in one line where it cannot (a
missing object or bucket, a refused credential). `ReadAhead` fetches the next shards of a
stream in a background thread while the current one is decoded, and `--shard-cache DIR` keeps
fetched shards on local disk for the next epoch.
"""

from __future__ import annotations

import hashlib
import io
import os
import re
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from vitkit.errors import VitkitError

RETRIES = 3  # attempts of a read that failed for a reason a retry can cure
_SCHEME = re.compile(r"^[a-z][a-z0-9+.-]*://")
_SECRETS = ("AWS_SECRET_ACCESS_KEY", "AWS_ACCESS_KEY_ID", "AWS_SESSION_TOKEN")


def is_remote(spec: object) -> bool:
    """True for a URL (``s3://``, ``gs://``, ``https://``, ...), False for a local path."""
    return isinstance(spec, str) and bool(_SCHEME.match(spec))


def join(root: str, name: str) -> str:
    return root.rstrip("/") + "/" + name


def _filesystem(url: str) -> Any:
    try:
        import fsspec
    except ImportError:
        need = "the cloud extra: pip install '.[cloud]' in vitkit's clone"
        raise VitkitError(f"{url}: object storage needs fsspec ({need})") from None
    protocol = url.split("://", 1)[0]
    try:
        return fsspec.filesystem(protocol)
    except (ImportError, ValueError) as e:
        extra = {"s3": "s3fs", "gs": "gcsfs", "gcs": "gcsfs"}.get(protocol, f"{protocol} support")
        raise VitkitError(f"{url}: cannot read {protocol}:// ({e}); install {extra}") from None


def _reason(e: BaseException) -> str:
    """An exception as one line, with any credential the environment holds blanked out."""
    text = " ".join(f"{type(e).__name__}: {e}".split())
    for name in _SECRETS:
        value = os.environ.get(name)
        if value:
            text = text.replace(value, "***")
    return text[:300]


def _retryable(e: BaseException) -> bool:
    if isinstance(e, FileNotFoundError | PermissionError | IsADirectoryError):
        return False
    text = str(e)
    if re.search(r"\b(403|404|AccessDenied|InvalidAccessKeyId|SignatureDoesNotMatch)\b", text):
        return False
    if re.search(r"\b(429|500|502|503|504|SlowDown|Throttl\w*|RequestTimeout)\b", text):
        return True  # a busy or failing server: the next attempt may pass
    return isinstance(e, OSError | TimeoutError | ConnectionError) or "Timeout" in type(e).__name__


def _fail(url: str, e: BaseException) -> VitkitError:
    reason = _reason(e)
    if isinstance(e, PermissionError) or re.search(
        r"AccessDenied|InvalidAccessKeyId|SignatureDoesNotMatch|Forbidden|\b403\b", reason
    ):
        return VitkitError(
            f"{url}: access denied ({reason}); check the credentials the environment gives "
            "(AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, AWS_PROFILE, ~/.aws)"
        )
    if isinstance(e, FileNotFoundError) or re.search(r"NoSuchBucket|NoSuchKey|\b404\b", reason):
        return VitkitError(f"{url}: not found, the object or its bucket is gone ({reason})")
    return VitkitError(f"{url}: unreadable after {RETRIES} attempts ({reason})")


def read_bytes(url: str, expected_size: int | None = None) -> bytes:
    """The whole object at ``url``; retried (with a growing pause) on errors a retry can cure
    and on a short read against ``expected_size``, else one line."""
    fs = _filesystem(url)
    for attempt in range(RETRIES):
        try:
            data = fs.cat_file(url)
        except Exception as e:  # noqa: BLE001 (fsspec backends raise their own kinds)
            if not _retryable(e) or attempt == RETRIES - 1:
                raise _fail(url, e) from None
        else:
            if expected_size is None or len(data) == expected_size:
                return bytes(data)
            if attempt == RETRIES - 1:
                raise VitkitError(
                    f"{url}: truncated object, {len(data):,} bytes where shards.json records "
                    f"{expected_size:,} (read {RETRIES} times); write the shards again"
                )
        fs.invalidate_cache()
        time.sleep(0.2 * 2**attempt)
    raise AssertionError("unreachable")


def write_bytes(url: str, data: bytes) -> None:
    fs = _filesystem(url)
    try:
        fs.pipe_file(url, data)
    except NotImplementedError:
        raise VitkitError(f"{url}: this storage cannot be written to") from None
    except Exception as e:  # noqa: BLE001
        raise _fail(url, e) from None


def exists(url: str) -> bool:
    fs = _filesystem(url)
    try:
        return bool(fs.exists(url))
    except Exception as e:  # noqa: BLE001
        raise _fail(url, e) from None


def upload(local: Path, url: str) -> None:
    """Put the local file ``local`` at ``url`` (a shard just written)."""
    write_bytes(url, local.read_bytes())


class ShardCache:
    """Fetched shards kept in ``root`` for the next epoch (``--shard-cache DIR``): one file per
    URL, written atomically and checked against the size the index records."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)

    def path(self, url: str) -> Path:
        digest = hashlib.sha256(url.encode()).hexdigest()[:16]
        return self.root / f"{digest}-{url.rstrip('/').rsplit('/', 1)[-1]}"

    def read(self, url: str, expected_size: int | None) -> bytes:
        path = self.path(url)
        if path.is_file() and (expected_size is None or path.stat().st_size == expected_size):
            return path.read_bytes()
        data = read_bytes(url, expected_size)
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{threading.get_ident()}")
        tmp.write_bytes(data)
        os.replace(tmp, path)
        return data


def fetch(url: str, expected_size: int | None, cache: str | None) -> bytes:
    if cache:
        return ShardCache(cache).read(url, expected_size)
    return read_bytes(url, expected_size)


class ReadAhead:
    """The shards of one stream, each fetched whole up to ``depth`` shards ahead of the one
    being decoded, in a background thread: memory holds at most ``depth + 1`` shards."""

    def __init__(
        self, shards: Sequence[tuple[str, int | None]], depth: int, cache: str | None
    ) -> None:
        self.shards = list(shards)
        self.depth = max(1, depth)
        self.cache = cache

    def __iter__(self) -> Iterator[io.BytesIO]:
        with ThreadPoolExecutor(max_workers=1) as pool:
            pending: list[Future[bytes]] = []
            todo = iter(self.shards)
            for url, size in todo:
                pending.append(pool.submit(fetch, url, size, self.cache))
                if len(pending) >= self.depth:
                    break
            while pending:
                data = pending.pop(0).result()
                nxt = next(todo, None)
                if nxt is not None:
                    pending.append(pool.submit(fetch, nxt[0], nxt[1], self.cache))
                yield io.BytesIO(data)


__all__ = [
    "ReadAhead",
    "ShardCache",
    "exists",
    "fetch",
    "is_remote",
    "join",
    "read_bytes",
    "upload",
    "write_bytes",
]
