"""A run's ``checkpoints/`` directory (torchtitan's ``CheckpointManager``): write a step's
checkpoint and move ``LATEST`` atomically, prune old ones, and on resume find the newest, check
that it is the same run and load the model's and optimizer's state — single-file or distributed
(DCP, any world size)."""

from __future__ import annotations

import json
import os
import shutil
import warnings
from pathlib import Path
from typing import Any

from torch import nn

from vitkit.checkpoints import (
    LATEST,
    atomic_write_text,
    config_diff,
    load_checkpoint,
    load_state_dict_strict,
    resolve_checkpoint,
    save_checkpoint,
)
from vitkit.checkpoints.native.sharded import (
    is_distributed_checkpoint,
    load_distributed_checkpoint,
    save_distributed_checkpoint,
)
from vitkit.errors import VitkitError
from vitkit.registry.model_config import ModelConfig, PreprocessConfig
from vitkit.train import distributed as D
from vitkit.train.train_config import (
    NUMERIC_CHANGES,
    RESUMABLE_CHANGES,
    WORKER_CHANGES,
    TrainConfig,
)


def check_same_run(
    path: Path, saved_config: str, now: TrainConfig, *, in_memory: bool = False
) -> None:
    """Refuse to resume the run saved at ``path`` with settings that change what is trained;
    warn about those that change the arithmetic (``in_memory`` data: the workers do not)."""
    saved = TrainConfig.from_dict(json.loads(saved_config))
    current = now.to_dict()
    changed = [
        f"{k}: {v!r} -> {current[k]!r}"
        for k, v in saved.to_dict().items()
        if k not in RESUMABLE_CHANGES and v != current[k]
    ]
    if changed:
        raise VitkitError(
            f"{path}: resuming with other training settings than the run's "
            f"would not continue the same run: {'; '.join(changed)}"
        )
    numeric = [
        f"{k} {v!r} -> {current[k]!r}"
        for k, v in saved.to_dict().items()
        if k in NUMERIC_CHANGES
        and v is not None
        and v != current[k]
        and not (in_memory and k in WORKER_CHANGES)
    ]
    if numeric:
        warnings.warn(
            f"{path}: resuming with {', '.join(numeric)}: the result will not be bitwise the "
            "same as the uninterrupted run's",
            stacklevel=2,
        )


def saved_run_config(run_dir: Path) -> TrainConfig:
    """The settings of the run in ``run_dir``, for resuming it: its ``train_config.json``
    (written before its first step), else its newest checkpoint's; refuses a directory that
    holds neither rather than resume something else."""
    saved = run_dir / "train_config.json"
    if saved.is_file():
        try:
            return TrainConfig.from_dict(json.loads(saved.read_text()))
        except (json.JSONDecodeError, TypeError, ValueError) as e:
            raise VitkitError(f"{saved}: unreadable training config ({e})") from None
    if (run_dir / "checkpoints" / LATEST).is_file():
        path = resolve_checkpoint(run_dir)
        try:
            return TrainConfig.from_dict(load_checkpoint(path).meta["train_config"])
        except (KeyError, TypeError, ValueError) as e:
            raise VitkitError(f"{path}: names no training config to resume ({e!r})") from None
    raise VitkitError(f"{run_dir} has no checkpoint to resume; start it again without --resume")


# What a run directory holds before its train_config.json is written (a run killed at once).
_RUN_ENTRIES = frozenset({"checkpoints", "metrics.jsonl"})


def holds_run(run_dir: Path) -> bool:
    """``--resume auto``: True if ``run_dir`` holds a vitkit run to continue (its
    ``train_config.json`` or a checkpoint), False if it holds none yet (absent, empty, or only
    what a run writes before its settings); refuses a directory that holds something else."""
    if not run_dir.exists():
        return False
    if not run_dir.is_dir():
        raise VitkitError(f"{run_dir}: is not a directory; --resume auto needs a run directory")
    if (run_dir / "train_config.json").is_file() or (run_dir / "checkpoints" / LATEST).is_file():
        return True
    others = sorted(p.name for p in run_dir.iterdir() if p.name not in _RUN_ENTRIES)
    if others:
        listed = ", ".join(others[:3]) + (" ..." if len(others) > 3 else "")
        raise VitkitError(
            f"{run_dir}: holds files that are not a vitkit run ({listed}); --resume auto "
            "starts or continues a run only in its own directory: choose another --out-dir"
        )
    return False


def fresh_run_dir(path: Path) -> Path:
    """``path`` if it holds nothing yet (absent or an empty directory), else the first of
    ``path-2``, ``path-3``, ... that does: a new run never writes into another's files."""
    candidate, n = path, 1
    while os.path.lexists(candidate) and not (candidate.is_dir() and not any(candidate.iterdir())):
        n += 1
        candidate = path.with_name(f"{path.name}-{n}")
    return candidate


def _check_architecture(path: Path, saved: ModelConfig, now: ModelConfig) -> None:
    diff = config_diff(saved, now)
    if diff:
        raise VitkitError(
            f"{path}: checkpoint is of another architecture than requested: " + "; ".join(diff)
        )


class CheckpointManager:
    """Saves and restores the checkpoints of the run in ``run_dir``."""

    def __init__(self, run_dir: Path, dist: D.DistEnv, keep: int) -> None:
        self.run_dir = run_dir
        self.dist = dist
        self.keep = keep

    @property
    def dir(self) -> Path:
        return self.run_dir / "checkpoints"

    def has_checkpoint(self) -> bool:
        return (self.dir / LATEST).exists()

    def latest_name(self) -> str:
        """The directory name ``LATEST`` points at."""
        return (self.dir / LATEST).read_text().strip()

    def save(
        self,
        step: int,
        model: nn.Module,
        optimizer: Any,
        *,
        model_config: ModelConfig,
        preprocess: PreprocessConfig,
        class_names: tuple[str, ...],
        meta: dict[str, Any],
        train_state: dict[str, Any],
    ) -> Path:
        """Write ``checkpoints/step_NNNNNNNN`` (every rank its shards in a distributed run),
        then point ``LATEST`` at it and delete all but the newest ``keep``."""
        name = f"step_{step:08d}"
        if self.dist.enabled:
            path = save_distributed_checkpoint(
                self.dir / name,
                model,
                optimizer,
                model_config=model_config,
                preprocess=preprocess,
                class_names=class_names,
                meta=meta,
                train_state=train_state,
            )
            if not self.dist.is_main:
                D.barrier(self.dist)  # until rank 0 has moved LATEST
                return path
        else:
            path = save_checkpoint(
                self.dir / name,
                model,
                preprocess=preprocess,
                class_names=class_names,
                meta=meta,
                train_state=train_state,
            )
        atomic_write_text(self.dir / LATEST, name + "\n")
        others = [p for p in self.dir.glob("step_*") if p.is_dir() and p.name != name]
        older = sorted(p for p in others if p.name < name)
        stale = [p for p in others if p.name > name]  # left by a run killed before LATEST moved
        for p in stale + older[: max(0, len(older) - (self.keep - 1))]:
            shutil.rmtree(p, ignore_errors=True)
        if self.dist.enabled:
            D.barrier(self.dist)
        return path

    def restore(
        self,
        model: nn.Module,
        optimizer: Any,
        model_config: ModelConfig,
        run: TrainConfig,
        *,
        in_memory: bool = False,
    ) -> tuple[Path, dict[str, Any]] | None:
        """Load the newest checkpoint's model and optimizer state into ``model`` and
        ``optimizer`` after checking that it is this run; returns its path and the rest of its
        training state (counters, RNG states, ...), or None if the run has no checkpoint."""
        if not (self.dir / LATEST).is_file():
            return None
        if is_distributed_checkpoint(resolve_checkpoint(self.run_dir)):
            path = resolve_checkpoint(self.run_dir)
            _check_architecture(path, load_checkpoint(path).model_config, model_config)
            state = load_distributed_checkpoint(path, model, optimizer)
            try:
                check_same_run(path, state["train_config"], run, in_memory=in_memory)
            except (KeyError, TypeError, ValueError) as e:
                raise VitkitError(f"{path}: incomplete training state ({e!r})") from None
            return path, state
        ckpt = load_checkpoint(self.run_dir, with_train_state=True)
        _check_architecture(ckpt.path, ckpt.model_config, model_config)
        state = ckpt.train_state or {}
        try:
            check_same_run(ckpt.path, state["train_config"], run, in_memory=in_memory)
            if self.dist.enabled:  # parameter names, not positions: fits DDP and FSDP alike
                D.load_full_state(model, optimizer, ckpt.state_dict, state["optimizer"])
            else:
                load_state_dict_strict(model, ckpt.state_dict, source=str(ckpt.path))
                optimizer.load_state_dict(state["optimizer"])
        except (KeyError, TypeError, ValueError) as e:
            raise VitkitError(f"{ckpt.path}: incomplete training state ({e!r})") from None
        return ckpt.path, state
