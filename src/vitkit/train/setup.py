"""Building a run's parts from its :class:`TrainConfig`: the data splits, the starting
checkpoint of a fine-tuning run (at the run's resolution, with the paper's new head) and the
model's config."""

from __future__ import annotations

import warnings
from typing import Any

import torch

from vitkit.checkpoints import Checkpoint, read_checkpoint
from vitkit.checkpoints.formats import adapt_checkpoint
from vitkit.checkpoints.overrides_applied import PREPROCESS_FIELDS
from vitkit.checkpoints.posemb_kernels import load_time_kernel
from vitkit.data import DataInfo, is_shard_dir, load_dataset
from vitkit.errors import VitkitError
from vitkit.registry.config_checks import check_fields
from vitkit.registry.model_config import ModelConfig, ResNetConfig, model_config
from vitkit.train.train_config import TrainConfig


def _data_kwargs(cfg: TrainConfig) -> dict[str, Any]:
    kw: dict[str, Any] = {"seed": cfg.seed, "on_bad_image": cfg.on_bad_image}
    if cfg.val_size is not None:
        kw["val_size"] = cfg.val_size
    if cfg.data_root is not None:
        kw["root"] = cfg.data_root
    return kw


def load_train_split(cfg: TrainConfig) -> Any:
    """The training images, with the run's augmentation (ImageFolder: Inception crop + flip)
    and subset."""
    return load_dataset(
        cfg.data,
        "train",
        image_size=cfg.image_size,
        train_transform=cfg.augment != "none",
        train_size=cfg.train_size,
        **_data_kwargs(cfg),
    )


def load_eval_split(cfg: TrainConfig, split: str) -> Any:
    """The ``val`` or ``test`` split, or None where the run has none (``val_size=0``; shards
    written without it)."""
    if split == "val" and cfg.val_size == 0:
        return None  # no held-out slice asked for
    if is_shard_dir(cfg.data):  # shards hold the splits they were written with
        from vitkit.data.shards_index import shard_splits

        if split not in shard_splits(cfg.data):
            return None
    return load_dataset(
        cfg.data,
        split,  # type: ignore[arg-type]
        image_size=cfg.image_size,
        train_transform=False,
        **_data_kwargs(cfg),
    )


def init_checkpoint(cfg: TrainConfig, info: DataInfo) -> Checkpoint:
    """``cfg.init_from`` (any format, read once) at this run's resolution, with the paper's
    zero-initialised head for ``info``'s classes and without pre-logits (Sec. 3.2)."""
    with warnings.catch_warnings():
        if cfg.new_head:  # a zeroed head is about to be replaced: nothing to warn about (what
            # the file does not say, AssumptionWarning, is still said)
            warnings.filterwarnings("ignore", message=".*the classification head is all zeros")
        return _read_init(cfg, info)


def _read_init(cfg: TrainConfig, info: DataInfo) -> Checkpoint:
    k = info.num_classes
    # settings a checkpoint does not say (-o gelu=quick on a bare file): stated when reading
    # it, so nothing is assumed; a setting the file does say is the fine-tuning check's below
    # -o num_heads=N is also the reading hint of a bare state dict that cannot be read without
    # it (a width timm does not register: heads are never in the weights), as --num-heads is
    # for eval / predict; a file that says its heads is read as it says
    heads = None
    hints: dict[str, Any] = {} if cfg.init_arch is None else {"arch": cfg.init_arch}  # --arch
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (the read below says what is still assumed)
        try:
            sources = read_checkpoint(cfg.init_from, **hints).provenance  # type: ignore[arg-type]
        except VitkitError:
            heads = cfg.model_overrides.get("num_heads")
            if heads is None:
                raise
            sources = read_checkpoint(cfg.init_from, num_heads=heads, **hints).provenance  # type: ignore[arg-type]
    assumed = {f for f, s in (sources.sources if sources else {}).items() if s == "assumed"}
    # the preprocessing (-o mean=...) changes no weight: stated over what the file says too
    stated = {
        f: v for f, v in cfg.model_overrides.items() if f in assumed or f in PREPROCESS_FIELDS
    }
    probe = read_checkpoint(cfg.init_from, num_heads=heads, overrides=stated, **hints)  # type: ignore[arg-type]
    size = cfg.image_size or info.image_size
    if not cfg.new_head and probe.model_config.num_classes != k:
        raise VitkitError(
            f"{cfg.init_from}: its head has {probe.model_config.num_classes} classes but "
            f"dataset '{info.name}' has {k}; fine-tune with a new head"
        )
    ckpt = adapt_checkpoint(
        probe,
        image_size=size,
        num_classes=k,
        pre_logits=None if cfg.keep_pre_logits else False,
        resample=cfg.init_resample or load_time_kernel(probe),  # None: pos_resample
    )
    if cfg.new_head and ckpt.model_config.num_classes == probe.model_config.num_classes:
        for key in ("head.weight", "head.bias", "head_dist.weight", "head_dist.bias"):
            if key in ckpt.state_dict:  # (DeiT's distillation head is replaced too)
                ckpt.state_dict[key] = torch.zeros_like(ckpt.state_dict[key])
    return ckpt


def finetune_model_config(cfg: TrainConfig, init: Checkpoint) -> ModelConfig:
    """The starting checkpoint's config with the model options a fine-tuning run may set:
    those that do not change the weights (dropout, attention dropout, stochastic depth)."""
    cls = type(init.model_config)  # one message with every command's: "unknown model option(s)"
    model_fields = set(cfg.model_overrides) - set(PREPROCESS_FIELDS) - {"crop_pct", "resize"}
    check_fields(
        cls, model_fields, "ResNet model option(s)" if cls is ResNetConfig else "model option(s)"
    )
    ignored = sorted({"crop_pct", "resize"} & set(cfg.model_overrides))
    if ignored:  # the run crops as its data does: 1.0 in memory, 0.875 for image folders
        raise VitkitError(
            f"fine-tuning from {cfg.init_from}: {', '.join(ignored)} would not be used (training "
            "crops as its data does); give them to 'vitkit eval' / 'vitkit predict' instead"
        )
    allowed = set()
    if not isinstance(init.model_config, ResNetConfig):
        allowed = {"dropout", "attn_dropout", "drop_path", "head_dropout"}
    have = init.model_config.to_dict()
    # A recipe's model sizes that equal the checkpoint's change nothing: not an error; nor do
    # the preprocessing settings (-o mean=...), stated when it was read (_read_init).
    same = {k for k, v in cfg.model_overrides.items() if have.get(k, object()) == v}
    same |= {k for k in cfg.model_overrides if k in PREPROCESS_FIELDS}
    bad = sorted(set(cfg.model_overrides) - allowed - same)
    if bad:
        raise VitkitError(
            f"fine-tuning from {cfg.init_from}: model options {', '.join(bad)} would change "
            "its weights; "
            + (f"only {', '.join(sorted(allowed))} may be set" if allowed else "none may be set")
        )
    overrides = {k: v for k, v in cfg.model_overrides.items() if k not in same}
    return init.model_config.replace(**overrides)


def classifier_config(cfg: TrainConfig, info: DataInfo) -> ModelConfig:
    """``cfg.model`` with its overrides, sized for the data: its classes, channels and size."""
    overrides = dict(cfg.model_overrides)
    overrides.setdefault("num_classes", info.num_classes)
    overrides.setdefault("in_chans", info.channels)
    overrides.setdefault("image_size", cfg.image_size or info.image_size)
    if overrides["num_classes"] != info.num_classes:
        raise VitkitError(
            f"num_classes={overrides['num_classes']} but dataset '{info.name}' has "
            f"{info.num_classes} classes"
        )
    return model_config(cfg.model, **overrides)
