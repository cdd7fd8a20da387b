"""A Hugging Face model id (``google/vit-base-patch16-224``, ``timm/NAME@REVISION``) -> the
folder the local Hugging Face cache holds for it. Offline only: nothing is downloaded.

The cache layout is read directly rather than through ``huggingface_hub`` (not a dependency
of vitkit, and its presence must not change what a path means): the cache is
``$HF_HUB_CACHE``, else ``$HF_HOME/hub``, else ``$XDG_CACHE_HOME/huggingface/hub``, else
``~/.cache/huggingface/hub`` (huggingface_hub's own order); a model lives in
``models--ORG--NAME``, ``refs/REVISION`` holds the commit hash of a branch or tag (``main``
by default) and ``snapshots/HASH/`` the files (symlinks into ``blobs/``). timm's hub weights
(``timm/...``) are cached in the same place.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from vitkit.errors import VitkitError

# huggingface_hub's repo id rules: ORG/NAME of letters, digits, '-', '_', '.'; optional @REVISION
_ID = re.compile(r"^([A-Za-z0-9][\w.-]{0,95})/([A-Za-z0-9][\w.-]{0,95})(?:@([\w./-]+))?$")
_COMMIT = re.compile(r"^[0-9a-f]{40}$")
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin", "open_clip_pytorch_model.bin")


def looks_like_id(text: str) -> bool:
    """``ORG/NAME`` or ``ORG/NAME@REVISION`` (a path such as ``runs/x`` also does: the caller
    tries the file system first)."""
    m = _ID.match(text)
    return m is not None and not any(".." in g or "--" in g for g in m.groups() if g)


def hub_cache_dir() -> Path:
    """The Hugging Face hub cache, found as huggingface_hub finds it."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    if os.environ.get("HUGGINGFACE_HUB_CACHE"):  # (the older name)
        return Path(os.environ["HUGGINGFACE_HUB_CACHE"]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    xdg = os.environ.get("XDG_CACHE_HOME") or "~/.cache"
    return Path(xdg).expanduser() / "huggingface" / "hub"


def download_hint(repo_id: str, revision: str | None) -> str:
    rev = f" --revision {revision}" if revision else ""
    return f"download it on a connected machine: 'hf download {repo_id}{rev}' (huggingface_hub)"


def resolve_model_id(text: str) -> Path:
    """The cached snapshot folder of model id ``text`` (``ORG/NAME[@REVISION]``); one-line
    :class:`VitkitError` naming the id and the problem when it is not cached, its revision is
    unknown, or its snapshot holds no weights."""
    m = _ID.match(text)
    if not m or not looks_like_id(text):
        raise VitkitError(f"{text}: not a Hugging Face model id (ORG/NAME or ORG/NAME@REVISION)")
    org, name, revision = m.groups()
    repo_id = f"{org}/{name}"
    cache = hub_cache_dir()
    repo = cache / f"models--{org}--{name}"
    hint = download_hint(repo_id, revision)
    if not repo.is_dir():
        raise VitkitError(
            f"{text}: no such file or directory, and no model {repo_id} in the Hugging Face "
            f"cache {cache} (looked for {repo.name}; set HF_HUB_CACHE or HF_HOME to use "
            f"another cache); if it is a model id, {hint}"
        )
    rev = revision or "main"
    if _COMMIT.match(rev):
        commit = rev
    else:
        ref = repo / "refs" / rev
        if not ref.is_file():
            known = sorted(
                str(p.relative_to(repo / "refs")) for p in (repo / "refs").rglob("*") if p.is_file()
            )
            raise VitkitError(
                f"{text}: the cached {repo_id} has no revision '{rev}' ({repo / 'refs'} holds "
                f"{', '.join(known) or 'none'}); {hint}"
            )
        if not _inside(ref, repo / "refs"):
            raise VitkitError(f"{text}: {ref} leads outside {repo / 'refs'}; {hint}")
        commit = ref.read_text(errors="replace").strip()
        if not _COMMIT.match(commit):  # ('../../x' would leave the cache)
            raise VitkitError(
                f"{text}: {ref} holds {commit[:50]!r}, not a commit hash (40 hex digits); {hint}"
            )
    snap = repo / "snapshots" / commit
    if snap.exists() and not _inside(snap, repo / "snapshots"):
        raise VitkitError(f"{text}: {snap} leads outside {repo / 'snapshots'}; {hint}")
    if not snap.is_dir():
        raise VitkitError(
            f"{text}: revision '{rev}' of the cached {repo_id} is commit {commit}, but "
            f"{snap} does not exist; {hint}"
        )
    _check_snapshot(text, repo_id, snap, hint)
    return snap


def _inside(path: Path, root: Path) -> bool:
    """``path`` (links followed) is ``root``'s or lies in it (links followed too)."""
    real, top = path.resolve(), root.resolve()
    return real == top or top in real.parents


def _check_snapshot(text: str, repo_id: str, snap: Path, hint: str) -> None:
    """A snapshot vitkit can read: config.json and a weights file, present (a symlink into
    ``blobs/`` whose blob is missing counts as absent)."""
    present = sorted(p.name for p in snap.iterdir() if p.exists())
    broken = sorted(p.name for p in snap.iterdir() if not p.exists())
    gone = f" ({', '.join(broken)}: links to missing blobs)" if broken else ""
    have = ", ".join(present) or "nothing"
    if not any(w in present for w in WEIGHT_FILES + ("model.safetensors.index.json",)):
        raise VitkitError(
            f"{text}: the cached snapshot {snap} holds no weights vitkit reads "
            f"({' or '.join(WEIGHT_FILES[:2])}; it holds {have}){gone}; {hint}"
        )
    if "config.json" not in present:
        raise VitkitError(
            f"{text}: the cached snapshot {snap} has no config.json (it holds {have}){gone}; {hint}"
        )
