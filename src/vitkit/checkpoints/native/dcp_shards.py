"""The weights of a distributed checkpoint: the ``dcp/`` shards written by
``torch.distributed.checkpoint`` (DCP) through its Hugging Face storage layer, and reading them.

The bottom of the checkpoint modules: safetensors_io.py reads a distributed checkpoint's model
weights with `read_model_state` (so ``load_checkpoint`` takes either kind of checkpoint), sharded.py
saves and loads shards with the same layout. The layout of the whole directory is in sharded.py.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from vitkit.errors import VitkitError

DCP_DIR = "dcp"
MODEL_PREFIX = "model."
OPTIM_PREFIX = "optim."


def dcp_reader(path: Path) -> Any:
    """DCP's reader of the shards of the checkpoint directory `path`."""
    from torch.distributed.checkpoint import HuggingFaceStorageReader

    return HuggingFaceStorageReader(str(path / DCP_DIR))


def stored_tensors(path: Path) -> dict[str, Any]:
    """The tensors a distributed checkpoint holds: ``{key: TensorStorageMetadata}``."""
    try:
        return dict(dcp_reader(path).read_metadata().state_dict_metadata)
    except Exception as e:  # safetensors / DCP raise assorted types for damaged files
        raise VitkitError(f"{path / DCP_DIR}: unreadable distributed checkpoint ({e})") from None


def load_tensors(path: Path, tensors: dict[str, Tensor], *, no_dist: bool) -> None:
    """Fill `tensors` (full or sharded, named as stored) from the shards of `path`."""
    import torch.distributed.checkpoint as dcp

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*torch.distributed is disabled.*")
        dcp.load(tensors, storage_reader=dcp_reader(path), no_dist=no_dist)


def read_model_state(path: str | Path) -> dict[str, Tensor]:
    """The full (unsharded) model weights of a distributed checkpoint, in this process only."""
    path = Path(path)
    tensors = {
        k: torch.empty(tuple(m.size), dtype=m.properties.dtype)
        for k, m in stored_tensors(path).items()
        if k.startswith(MODEL_PREFIX)
    }
    if not tensors:
        raise VitkitError(f"{path / DCP_DIR}: holds no model weights")
    load_tensors(path, tensors, no_dist=True)
    return {k[len(MODEL_PREFIX) :]: v for k, v in tensors.items()}


__all__ = [
    "DCP_DIR",
    "MODEL_PREFIX",
    "OPTIM_PREFIX",
    "dcp_reader",
    "load_tensors",
    "read_model_state",
    "stored_tensors",
]
