"""NaFlex training (``TrainConfig.max_seq_len``; ``vitkit train / finetune --naflex``): what a
run does differently when every image keeps its aspect ratio (``data.naflex_batches``).

The loader resizes each image to at most ``max_seq_len`` patches at its own aspect ratio and
packs a batch with a valid mask (uint8); ``prepare`` normalises it on the device; the model's
NaFlex forward masks the padding out of attention and pooling (``vitkit.models.naflex_packing``).
Training, validation and the final test evaluation all run so; the report's attention analysis keeps
the model's own image size (a NaFlex model runs on pixels too).
"""

from __future__ import annotations

from typing import Any

import torch

from vitkit.data import DataInfo, make_loader
from vitkit.data.loader import EpochLoader
from vitkit.data.naflex_batches import (
    CollatePacked,
    NaFlexTransform,
    PackedImages,
    native_dataset,
    normalize_packed,
)
from vitkit.errors import VitkitError
from vitkit.registry.model_config import ModelConfig, PreprocessConfig, ViTConfig
from vitkit.train.train_config import TrainConfig


def check_naflex_run(cfg: TrainConfig, model_cfg: ModelConfig, distributed: bool) -> None:
    """One line where a run with ``max_seq_len`` cannot train ``model_cfg``."""
    if not isinstance(model_cfg, ViTConfig) or not model_cfg.naflex:
        what = f"{cfg.init_from} holds" if cfg.init_from else f"--model {cfg.model} is"
        raise VitkitError(
            f"--naflex needs a NaFlex model and {what} {model_cfg.short_name} without NaFlex "
            "position embeddings: train one with -o naflex=true -o pos_embed_prefix=false, "
            "or fine-tune a NaFlex checkpoint (timm's naflexvit_*)"
        )
    if distributed:
        raise VitkitError("--naflex runs in one process for now (no torchrun)")


def naflex_loader(
    dataset: Any,
    batch_size: int,
    *,
    train: bool,
    cfg: TrainConfig,
    model_cfg: ViTConfig,
    preprocess: PreprocessConfig,
    info: DataInfo,
) -> EpochLoader:
    """Batches of :class:`PackedImages` of ``dataset``, in the order a fixed-size run has;
    a training loader flips as the run's augmentation allows (the only augmentation here)."""
    assert cfg.max_seq_len is not None
    transform = NaFlexTransform(
        model_cfg.patch_size,
        cfg.max_seq_len,
        preprocess.channels,
        preprocess.interpolation,
        flip=train and cfg.augment != "none" and info.allow_flip,
    )
    return make_loader(
        native_dataset(dataset, transform),
        batch_size,
        shuffle=train,
        drop_last=train,
        seed=cfg.seed if train else 0,
        num_workers=cfg.num_workers,
        pin_memory=cfg.pin_memory,
        persistent_workers=cfg.persistent_workers,
        prefetch_factor=cfg.prefetch_factor,
        collate_fn=CollatePacked(model_cfg.patch_size, cfg.max_seq_len),
    )


def prepare_packed(
    images: PackedImages, preprocess: PreprocessConfig, device: torch.device
) -> dict[str, torch.Tensor]:
    """A uint8 NaFlex batch → the model's input dict on ``device``, normalised."""
    pre = preprocess
    return normalize_packed(images.to(device), pre.channels, pre.mean, pre.std, pre.rescale_factor)
