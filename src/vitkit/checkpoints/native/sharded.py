"""Distributed checkpoints: every rank saves its own shards with ``torch.distributed.checkpoint``
(DCP); any number of processes (one included) can load them; one call consolidates them into
vitkit's single-file format.

A distributed checkpoint is a vitkit checkpoint directory whose weights are DCP shards::

    config.json          as in safetensors_io.py (model config, preprocessing, class names, meta)
    train_state.json     step, epoch, position, RNG, run config; optimizer hyper-parameters
    dcp/                 shard-NNNNN-model-00001-of-00001.safetensors, one per rank that
                         holds tensors: model weights ("model.<name>") and optimizer state
                         ("optim.state.<name>.<key>") with their DCP sharding offsets

The shards are written by DCP's Hugging Face storage layer: safetensors files whose header
records each chunk's offset in the full tensor. Reading them needs no pickle (DCP's default
file format stores its metadata as a pickle, which vitkit never loads) and works at any world
size: DCP reads the chunks each rank needs. State dicts are taken and set with
``torch.distributed.checkpoint.state_dict`` (get/set_model_state_dict,
get/set_optimizer_state_dict), which name every tensor by its parameter's name, so DDP, FSDP2
and a plain module save and load the same keys.

Writing is atomic as in safetensors_io.py: all ranks write into ``.NAME.tmp-dcp``; rank 0 adds the
JSON files, fsyncs and renames the directory into place once every rank is done.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from vitkit.checkpoints.formats import read_checkpoint, write_checkpoint
from vitkit.checkpoints.native.dcp_shards import (
    DCP_DIR,
    MODEL_PREFIX,
    OPTIM_PREFIX,
    load_tensors,
    read_model_state,
    stored_tensors,
)
from vitkit.checkpoints.native.safetensors_io import (
    CONFIG,
    FORMAT,
    FORMAT_VERSION,
    TRAIN_JSON,
    WEIGHTS,
    _read_json,
    _write_json,
    flatten_state,
    replace_dir,
    resolve_checkpoint,
    unflatten_state,
)
from vitkit.errors import VitkitError
from vitkit.output_files import fsync_dir, writing
from vitkit.registry.model_config import ModelConfig, PreprocessConfig


def is_distributed_checkpoint(path: str | Path) -> bool:
    """True for a checkpoint directory whose weights are DCP shards."""
    p = Path(path)
    return (p / DCP_DIR).is_dir() and not (p / WEIGHTS).is_file()


def _dist_ready() -> bool:
    return torch.distributed.is_available() and torch.distributed.is_initialized()


def _barrier() -> None:
    if _dist_ready():
        torch.distributed.barrier()


def _rank() -> int:
    return torch.distributed.get_rank() if _dist_ready() else 0


def _state_dicts(model: nn.Module, optimizer: torch.optim.Optimizer | None):
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        get_optimizer_state_dict,
    )

    msd = get_model_state_dict(model)
    osd: dict[str, Any] = {}
    if optimizer is not None:
        opts = StateDictOptions(flatten_optimizer_state_dict=True)
        osd = get_optimizer_state_dict(model, optimizer, options=opts)
    return msd, osd


def _tensors(msd: dict[str, Any], osd: dict[str, Any]) -> dict[str, Tensor]:
    out = {MODEL_PREFIX + k: v for k, v in msd.items()}
    out.update({OPTIM_PREFIX + k: v for k, v in osd.items() if isinstance(v, Tensor)})
    return out


def save_distributed_checkpoint(
    path: str | Path,
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None,
    *,
    model_config: ModelConfig,
    preprocess: PreprocessConfig,
    class_names: tuple[str, ...] | list[str] = (),
    meta: dict[str, Any] | None = None,
    train_state: dict[str, Any] | None = None,
) -> Path:
    """Save `model` (DDP, FSDP2 or plain) and `optimizer` as a distributed checkpoint at `path`.

    Every rank of the process group must call this (it is collective); `train_state` must be
    JSON-able and is taken from rank 0. Replaces an existing checkpoint at `path` atomically.
    """
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import HuggingFaceStorageWriter

    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-dcp")
    main = _rank() == 0
    if main:
        path.parent.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)  # left by a killed run
        (tmp / DCP_DIR).mkdir(parents=True)
    _barrier()
    # no room on any rank: dcp.save raises on every rank; one line, the temporary removed
    with writing(path, tmp if main else None):
        msd, osd = _state_dicts(model, optimizer)
        writer = HuggingFaceStorageWriter(str(tmp / DCP_DIR), save_distributed=True)
        dcp.save(_tensors(msd, osd), storage_writer=writer)
        _barrier()  # every rank's shards are on disk
        if main:
            hyper = {k: v for k, v in osd.items() if not isinstance(v, Tensor)}
            _, hyper_json = flatten_state(hyper)
            config = {
                "format": FORMAT,
                "version": FORMAT_VERSION,
                "model": model_config.to_dict(),
                "preprocess": preprocess.to_dict(),
                "class_names": list(class_names),
                "meta": meta or {},
            }
            _write_json(tmp / CONFIG, config)
            _write_json(tmp / TRAIN_JSON, {"state": train_state or {}, "optimizer": hyper_json})
            fsync_dir(tmp / DCP_DIR)
            replace_dir(tmp, path)
    _barrier()
    return path


def load_distributed_checkpoint(
    path: str | Path, model: nn.Module, optimizer: torch.optim.Optimizer | None
) -> dict[str, Any]:
    """Load a distributed checkpoint into `model` and `optimizer` (DDP, FSDP2 or plain, at any
    world size; collective when a process group is initialised). Returns the JSON train state.

    Refuses a checkpoint whose tensors do not match the model's, listing the differences.
    """
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    path = Path(path)
    msd, osd = _state_dicts(model, optimizer)
    wanted = _tensors(msd, osd)
    stored = stored_tensors(path)
    missing = sorted(k for k in wanted if k not in stored)
    unexpected = sorted(k for k in stored if k not in wanted)
    shapes = sorted(
        f"{k}: {tuple(stored[k].size)} stored, {tuple(wanted[k].shape)} in model"
        for k in wanted
        if k in stored and tuple(stored[k].size) != tuple(wanted[k].shape)
    )
    if missing or unexpected or shapes:
        problems = [
            f"{what}: {', '.join(keys[:8])}{' ...' if len(keys) > 8 else ''}"
            for what, keys in (("missing", missing), ("unexpected", unexpected), ("shapes", shapes))
            if keys
        ]
        raise VitkitError(f"{path}: checkpoint does not fit the model | {' | '.join(problems)}")
    load_tensors(path, wanted, no_dist=not _dist_ready())
    extra = _read_json(path / TRAIN_JSON)
    model_sd: dict[str, Any] = {
        k[len(MODEL_PREFIX) :]: v for k, v in wanted.items() if k.startswith(MODEL_PREFIX)
    }
    set_model_state_dict(model, model_sd)
    if optimizer is not None:
        osd.update(
            {k[len(OPTIM_PREFIX) :]: v for k, v in wanted.items() if k.startswith(OPTIM_PREFIX)}
        )
        osd.update(unflatten_state(extra.get("optimizer", {}), {}))
        opts = StateDictOptions(flatten_optimizer_state_dict=True)
        set_optimizer_state_dict(model, optimizer, osd, options=opts)
    return dict(extra.get("state", {}))


def consolidate_checkpoint(src: str | Path, dst: str | Path, *, overwrite: bool = False) -> Path:
    """Write the weights of the checkpoint `src` (distributed or not; a run directory means its
    latest) as a single-file vitkit checkpoint at `dst`, for evaluation, prediction, sharing or
    fine-tuning. Training state is not carried over (resume from `src` itself). As
    `write_checkpoint`, it deletes nothing it did not write: `dst` equal to or inside `src`, or
    not empty, is refused unless `overwrite` (which replaces only the files written)."""
    ckpt = read_checkpoint(resolve_checkpoint(src), format="vitkit")
    ckpt.meta = {**ckpt.meta, "consolidated_from": str(ckpt.path)}
    return write_checkpoint(ckpt, dst, "vitkit", source=src, overwrite=overwrite)


__all__ = [
    "DCP_DIR",
    "MODEL_PREFIX",
    "OPTIM_PREFIX",
    "consolidate_checkpoint",
    "is_distributed_checkpoint",
    "load_distributed_checkpoint",
    "read_model_state",
    "save_distributed_checkpoint",
]
