"""Top-k labels of image files, with the checkpoint's own preprocessing."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from vitkit.checkpoints import Checkpoint
from vitkit.data.images import load_images
from vitkit.data.transforms import normalize
from vitkit.errors import VitkitError
from vitkit.eval.checkpoint import check_finite_weights

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
    model: nn.Module, ckpt: Checkpoint, paths: Sequence[str | Path], k: int = 5
) -> list[Prediction]:
    """Top-``k`` predictions for each image file, preprocessed as the checkpoint says."""
    if not ckpt.model_config.num_classes:
        raise VitkitError(f"{ckpt.path}: the model has no classification head to predict with")
    check_finite_weights(model, ckpt)
    pre = ckpt.preprocess
    batch = normalize(load_images(paths, pre).float(), pre.mean, pre.std, pre.rescale_factor)
    with torch.inference_mode():
        probs = model(batch).float().softmax(-1)
    return top_k(probs, class_names(ckpt, probs.shape[-1]), k)
