"""(part of serve_load.py and serve_stacks.py) The models the serving benchmarks serve, with
random weights: the default MNIST ViT and B/16 at 224 px."""

from __future__ import annotations

from pathlib import Path

import torch


def mnist_checkpoint(path: Path) -> Path:
    """The default job's model (``vitkit train``: width 64, depth 6, 4 heads, 7x7 patches,
    28 px grey digits), random weights and a random head (so answers differ by image)."""
    import vitkit
    from vitkit.train.recipes import MNIST

    torch.manual_seed(0)
    model = vitkit.create_model(
        MNIST.model, num_classes=10, image_size=28, in_chans=1, **MNIST.model_overrides
    )
    with torch.no_grad():
        model.head.weight.normal_(0, 0.5)
    return vitkit.save_checkpoint(path, model, class_names=[str(i) for i in range(10)])


def b16_checkpoint(path: Path) -> Path:
    """B/16 at 224 px with 1000 classes, random weights and head."""
    import vitkit

    torch.manual_seed(0)
    model = vitkit.create_model("B/16", num_classes=1000, image_size=224)
    with torch.no_grad():
        model.head.weight.normal_(0, 0.02)
    return vitkit.save_checkpoint(path, model)
