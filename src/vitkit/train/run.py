"""What a training run is made of, built from its :class:`TrainConfig`: data, model (DDP /
FSDP2 / compiled), optimizer, schedule, augmentation, and the state a checkpoint saves and
restores. :class:`vitkit.train.trainer.Trainer` adds the loop; the parts with one job each live
beside them (``setup``, ``checkpoint_manager``, ``metrics``, ``report``).

Every source of randomness is derived from the seed: model init (global RNG seeded before
building), the data order (a generator per epoch), augmentation (``aug_generator``, seeded per
epoch and checkpointed) and dropout (the global RNG, checkpointed; reseeded per step and rank
in a distributed run).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from vitkit.checkpoints import Checkpoint, load_state_dict_strict
from vitkit.data import ArrayDataset, DataInfo, make_loader, to_model_input
from vitkit.data.naflex_batches import PackedImages
from vitkit.errors import VitkitError
from vitkit.eval.checkpoint_eval import non_finite_weights
from vitkit.hardware import resolve_precision
from vitkit.models.sdpa_backend import check_sdpa_backend, sdpa_backend, set_attention_backend
from vitkit.models.vit import build_model
from vitkit.output_files import check_run_dir
from vitkit.registry.model_config import ModelConfig, PreprocessConfig, ResNetConfig
from vitkit.train import distributed as D
from vitkit.train import setup
from vitkit.train.activation_checkpointing import apply_activation_checkpointing
from vitkit.train.augment import augment_batch
from vitkit.train.checkpoint_manager import CheckpointManager
from vitkit.train.compile import compile_for_training
from vitkit.train.ema import WeightAverage
from vitkit.train.float8 import check_fp8_device, convert_to_fp8, torchao_float8
from vitkit.train.metrics import MetricsLog
from vitkit.train.naflex_runs import check_naflex_run, naflex_loader, prepare_packed
from vitkit.train.optim import build_optimizer
from vitkit.train.schedules import warmup_decay
from vitkit.train.train_config import Precision, TrainConfig


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


class TrainingRun:
    """Everything a :class:`TrainConfig` describes, built; the loop is the Trainer's."""

    has_accuracy = True  # a training step's second value is an accuracy worth logging
    self_supervised = False  # the pre-trainer runs the objectives that need no labels

    def __init__(self, cfg: TrainConfig) -> None:
        check_run_dir(cfg.out_dir)  # before any work or banner: a refused place says so first
        if cfg.objective != "classify" and not self.self_supervised:
            raise VitkitError(
                f"objective {cfg.objective!r} is self-supervised pre-training: run it with "
                "'vitkit pretrain' (vitkit.train.pretrain.Pretrainer)"
            )
        if cfg.threads is not None:
            torch.set_num_threads(cfg.threads)
        self.dist = D.DistEnv.current()  # rank 0 of 1 without a process group
        self.device = _device(D.device_for(cfg.device, self.dist))
        # Recorded as they resolve here (see resume): the thread count, and "auto" precision
        # as bf16 where this device multiplies bf16 natively, else fp32 (vitkit.hardware).
        precision: Precision
        if cfg.precision == "fp8":  # bf16 autocast with float8 matmuls (train.float8)
            check_fp8_device(self.device)
            torchao_float8()
            precision = "fp8"
        else:
            precision = resolve_precision(cfg.precision, self.device)
        check_sdpa_backend(cfg.attention_backend, self.device)
        cfg = dataclasses.replace(cfg, threads=torch.get_num_threads(), precision=precision)
        self.cfg = cfg
        self.out = Path(cfg.out_dir)
        world = self.dist.world_size
        if cfg.batch_size % (cfg.accum_steps * world):
            raise VitkitError(
                f"batch size {cfg.batch_size} is not divisible by accum_steps {cfg.accum_steps} "
                f"x world size {world}"
            )
        self.micro_batch = cfg.batch_size // cfg.accum_steps // world  # per rank
        self.checkpoints = CheckpointManager(self.out, self.dist, cfg.keep_checkpoints)
        self.metrics = MetricsLog(self.out / "metrics.jsonl", self.dist.is_main)

        self.train_set = setup.load_train_split(cfg)
        self.info: DataInfo = self.train_set.info
        if cfg.elastic is not None and not isinstance(self.train_set, ArrayDataset):
            raise VitkitError(
                f"--elastic distorts in-memory batches; '{cfg.data}' is read from files (its "
                "augmentation is the loader's crop and flip)"
            )
        self.val_set = setup.load_eval_split(cfg, "val")
        self.test_set = setup.load_eval_split(cfg, "test")

        torch.manual_seed(cfg.seed)  # model init draws from the global RNG (same on every rank)
        self.init: Checkpoint | None = None
        if cfg.init_from:
            self.init = setup.init_checkpoint(cfg, self.info)
            self.model_cfg = setup.finetune_model_config(cfg, self.init)
        else:
            self.model_cfg = self.build_model_config()
        if cfg.max_seq_len is not None:  # --naflex: images at their own aspect ratios
            check_naflex_run(cfg, self.model_cfg, self.dist.enabled)
        self.model = build_model(self.model_cfg).to(self.device)
        if self.init is not None:
            load_state_dict_strict(self.model, self.init.state_dict, source=str(cfg.init_from))
        set_attention_backend(self.model, cfg.attention_backend)  # seen by torch.compile
        # The float8 layers hold the same weights as the Linears they replace: checkpoints are
        # unchanged. Swapped before the wrappers and the compiler see the model.
        self.fp8_layers: list[str] = []
        if cfg.precision == "fp8":
            self.fp8_layers = convert_to_fp8(
                self.model, cfg.fp8_recipe, cfg.fp8_min_params, batch=self.micro_batch
            )
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
                self.strategy,
                self.device,
                bf16=cfg.precision in ("bf16", "fp8"),
                blocks=self._units(),
            )
        if cfg.compile is not None:
            self.forward_model = compile_for_training(self.forward_model, cfg.compile, self.device)
        crop = 1.0 if isinstance(self.train_set, ArrayDataset) else 0.875
        self.preprocess = PreprocessConfig.for_model(self.model_cfg, crop_pct=crop)
        if self.init is not None:  # keep the checkpoint's normalisation and channels
            pre = self.init.preprocess
            self.preprocess = PreprocessConfig(
                self.model_cfg.image_size,
                pre.channels,
                pre.mean,
                pre.std,
                pre.interpolation,
                crop,
                rescale_factor=pre.rescale_factor,
            )
        self.ema: WeightAverage | None = None
        if cfg.ema_decay is not None:
            if self.dist.enabled:
                raise VitkitError("ema_decay is not supported under torchrun yet (one process)")
            self.ema = WeightAverage(self.model, cfg.ema_decay)
        self.optimizer = self.build_optimizer(self.model)
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
        # the epochs the run does: the config's, or fewer where max_steps ends it first (the
        # last one may be partial); what the banner and the progress lines count to
        self.epochs_planned = min(cfg.epochs, -(-self.total_steps // self.steps_per_epoch))
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

    # ----- set-up (hooks and helpers) ----------------------------------------------------

    def build_model_config(self) -> ModelConfig:
        """The model a run from scratch trains (hook: the pre-trainer's has no head)."""
        return setup.classifier_config(self.cfg, self.info)

    def build_optimizer(self, module: torch.nn.Module) -> torch.optim.Optimizer:
        """The run's optimizer over ``module``'s parameters (with its weight-decay groups)."""
        cfg = self.cfg
        return build_optimizer(
            module,
            cfg.optimizer,
            cfg.lr,
            cfg.weight_decay,
            betas=cfg.betas,
            momentum=cfg.momentum,
            # One kernel for all parameters where it is faster (vitkit.train.optim); FSDP's
            # sharded (DTensor) parameters keep the for-each implementation, which is what FSDP2
            # documents and tests.
            fused=False if self.strategy == "fsdp" else None,
        )

    def _loader(self, dataset: Any, batch_size: int, train: bool) -> Any:
        cfg = self.cfg
        if cfg.max_seq_len is not None:
            return naflex_loader(
                dataset,
                batch_size,
                train=train,
                cfg=cfg,
                model_cfg=self.model_cfg,  # type: ignore[arg-type]
                preprocess=self.preprocess,
                info=self.info,
            )
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
            read_ahead=cfg.read_ahead,
            shard_cache=cfg.shard_cache,
        )

    def _units(self) -> list[torch.nn.Module]:
        """The repeated units (encoder blocks; a ResNet's bottlenecks) for activation
        checkpointing and FSDP wrapping."""
        if isinstance(self.model_cfg, ResNetConfig):
            return [unit for stage in self.model.stages for unit in stage]  # type: ignore[union-attr]
        return list(self.model.blocks)  # type: ignore[arg-type]

    # ----- the data path -----------------------------------------------------------------

    def prepare(self, images: Tensor) -> Tensor:
        """uint8 batch → normalised float model input of the model's size and channels (a
        NaFlex batch: its patches normalised, ``train.naflex``)."""
        pre = self.preprocess
        if isinstance(images, PackedImages):
            return prepare_packed(images, pre, self.device)
        return to_model_input(
            images.to(self.device),
            pre.image_size,
            pre.channels,
            pre.mean,
            pre.std,
            pre.rescale_factor,
        )

    def augment(self, images: Tensor) -> Tensor:
        """Random augmentation of a uint8 batch, drawing only from ``self.aug_generator``:
        RandAugment (if asked) on any data; the geometric augmentation on in-memory data
        (ImageFolder data gets its crop and flip from the PIL transform in the loader)."""
        if isinstance(images, PackedImages):  # NaFlex: flipped (if at all) by its loader
            return images
        in_memory = isinstance(self.train_set, ArrayDataset)
        part = None  # this rank's rows of the global micro-batch
        if self.dist.enabled:
            part = (self.dist.rank * len(images), self.dist.world_size * len(images))
        return augment_batch(
            images,
            randaugment=self.cfg.randaugment,
            geometric=self.cfg.augment if in_memory else "none",
            image_size=self.model_cfg.image_size,
            allow_flip=self.info.allow_flip,
            generator=self.aug_generator,
            part=part,
            elastic=self.cfg.elastic,
        )

    @contextlib.contextmanager
    def _autocast(self) -> Iterator[None]:
        """What a training step computes in: bf16 autocast (also under fp8, whose float8
        matmuls sit inside the swapped layers), and the chosen attention kernel."""
        bf16 = self.cfg.precision in ("bf16", "fp8")
        with (
            torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=bf16),
            sdpa_backend(self.cfg.attention_backend),
        ):
            yield

    # ----- checkpoints -------------------------------------------------------------------

    @property
    def ckpt_dir(self) -> Path:
        return self.checkpoints.dir

    def train_state(self) -> dict[str, Any]:
        """What resuming needs besides the weights (hook: subclasses add their own)."""
        cfg_json = json.dumps(self.cfg.to_dict())
        if self.dist.enabled:  # model and optimizer go to the DCP shards; dropout is reseeded
            return {
                "step": self.step,
                "epoch": self.epoch,
                "batch_in_epoch": self.batch_in_epoch,
                "aug_rng": self.aug_generator.get_state().tolist(),
                "train_config": cfg_json,
            }
        return {
            "step": self.step,
            "epoch": self.epoch,
            "batch_in_epoch": self.batch_in_epoch,
            "optimizer": self.optimizer.state_dict(),
            "torch_rng": torch.get_rng_state(),
            "aug_rng": self.aug_generator.get_state(),
            "train_config": cfg_json,
            "ema": self.ema.state_dict() if self.ema is not None else None,
        }

    def load_train_state(self, state: dict[str, Any]) -> None:
        """Counters, RNG states and EMA from a checkpoint's training state (hook)."""
        aug = state["aug_rng"]
        self.aug_generator.set_state(
            aug if isinstance(aug, Tensor) else torch.tensor(aug, dtype=torch.uint8)
        )
        self.step, self.epoch = int(state["step"]), int(state["epoch"])
        self.batch_in_epoch = int(state["batch_in_epoch"])
        if "torch_rng" in state:
            torch.set_rng_state(state["torch_rng"])
        elif not self.dist.enabled:  # a distributed checkpoint: dropout's RNG as such a run
            torch.manual_seed(_step_seed(self.cfg.seed, self.step, 0))  # reseeds it
        if self.ema is not None:
            self.ema.load_state_dict(state["ema"])

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
        self._check_finite_weights()
        return self.checkpoints.save(
            self.step,
            self.model,
            self.optimizer,
            model_config=self.model_cfg,
            preprocess=self.preprocess,
            class_names=self._class_names(),
            meta=self._meta(),
            train_state=self.train_state(),
        )

    def _check_finite_weights(self) -> None:
        """Refuse to write a checkpoint with a NaN or infinite weight (every rank decides
        together: FSDP's shards are checked where they live and the count summed)."""
        bad = non_finite_weights(self.model)
        (count,) = D.all_reduce_sum([len(bad)], self.dist)
        if count:
            where = f" (first: {bad[0]})" if bad else ""
            raise VitkitError(
                f"{self.out}: training diverged before step {self.step}: {int(count)} weight "
                f"tensor(s) hold NaN or infinite values{where}; not saved, the checkpoints "
                f"in {self.ckpt_dir} are kept (lower --lr or set --grad-clip)"
            )

    def restore(self) -> bool:
        """Load the newest checkpoint of ``out_dir`` if there is one; True if resumed."""
        in_memory = isinstance(self.train_set, ArrayDataset)  # (no workers: --num-workers is moot)
        found = self.checkpoints.restore(
            self.model, self.optimizer, self.model_cfg, self.cfg, in_memory=in_memory
        )
        if found is None:
            return False
        path, state = found
        try:
            self.load_train_state(state)
        except (KeyError, TypeError, ValueError) as e:
            raise VitkitError(f"{path}: incomplete training state ({e!r})") from None
        self.metrics.truncate(self.step)
        if self.dist.is_main:
            print(
                f"{self.out}: continuing the run from {path.name} (step {self.step})",
                file=sys.stderr,
            )
        return True
