"""Top-k labels of image files, with the checkpoint's own preprocessing."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from vitkit.data.images import load_images, load_images_native
from vitkit.data.transforms import normalize
from vitkit.errors import VitkitError

if TYPE_CHECKING:  # (a .pt2 package is predicted with, vitkit's model code not imported)
    from vitkit.checkpoints import Checkpoint

Prediction = list[dict[str, Any]]  # [{"label", "index", "prob"}, ...], most probable first


def top_k(probs: Tensor, names: Sequence[str], k: int) -> list[Prediction]:
    """The ``k`` most probable classes of every row of ``probs`` [B, K]."""
    top_p, top_i = probs.topk(min(k, probs.shape[-1]), dim=-1)
    return [
        [{"label": names[i], "index": i, "prob": p} for p, i in zip(ps, idx)]
        for ps, idx in zip(top_p.tolist(), top_i.tolist())
    ]


def format_top_k(preds: Prediction) -> str:
    """``"7 98.1%  1 0.9%  ..."``."""
    return "  ".join(f"{q['label']} {100 * q['prob']:.1f}%" for q in preds)


def class_names(ckpt: Checkpoint, num_classes: int) -> tuple[str, ...]:
    """The checkpoint's class names, else the class indices as text."""
    return ckpt.class_names or tuple(str(i) for i in range(num_classes))


def predict_files(
    model: nn.Module,
    ckpt: Checkpoint,
    paths: Sequence[str | Path],
    k: int = 5,
    max_seq_len: int | None = None,
) -> list[Prediction]:
    """Top-``k`` predictions for each image file, preprocessed as the checkpoint says; with
    ``max_seq_len`` (a NaFlex model) each image keeps its aspect ratio, at most that many
    patches, and the images go in as one packed batch
    (:func:`vitkit.models.naflex_packing.pack`)."""
    cfg = ckpt.model_config
    if not cfg.num_classes:
        raise VitkitError(f"{ckpt.path}: the model has no classification head to predict with")
    if any(True for _ in model.parameters()):  # (a compiled package's weights were checked)
        from vitkit.eval.checkpoint_eval import check_finite_weights

        check_finite_weights(model, ckpt)
    pre = ckpt.preprocess
    batch: Any
    if max_seq_len is not None:
        if not getattr(cfg, "naflex", False):
            raise VitkitError(f"{ckpt.path}: --max-seq-len needs a NaFlex model (timm naflexvit)")
        patch = cfg.patch_size  # type: ignore[union-attr]
        images = load_images_native(paths, pre, patch, max_seq_len)
        images = [
            normalize(x.float()[None], pre.mean, pre.std, pre.rescale_factor)[0] for x in images
        ]
        from vitkit.models.naflex_packing import pack

        batch = pack(images, patch, max_seq_len)
    else:
        batch = normalize(load_images(paths, pre).float(), pre.mean, pre.std, pre.rescale_factor)
    with torch.inference_mode():
        probs = model(batch).float().softmax(-1)
    return top_k(probs, class_names(ckpt, probs.shape[-1]), k)
