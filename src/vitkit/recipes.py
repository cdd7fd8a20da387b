"""Named training recipes: each is a frozen :class:`TrainConfig` whose docstring states the
command, the expected time and the expected result on the machine it was measured on.

``smoke(recipe)`` shrinks any recipe to a seconds-long run for tests (big_vision's ``runlocal``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from vitkit.errors import VitkitError
from vitkit.train.trainer import TrainConfig

# A small ViT for 28x28 digits: patch 4 gives 49 tokens (+ class token), width 64, 6 blocks.
MNIST_MODEL = {"width": 64, "depth": 6, "num_heads": 4, "mlp_dim": 128}


@dataclass(frozen=True)
class Recipe:
    name: str
    doc: str  # command, expected time and result
    config: TrainConfig


MNIST = TrainConfig(
    data="mnist",
    model="Ti/4",
    model_overrides=MNIST_MODEL,
    epochs=9,
    batch_size=128,
    lr=3e-3,
    weight_decay=0.05,
    warmup_epochs=0.5,
    schedule="cosine",
    grad_clip=1.0,
    augment="digits",
    label_smoothing=0.0,
    precision="bf16",
    out_dir="runs/mnist",
)

RECIPES: dict[str, Recipe] = {
    r.name: r
    for r in (
        Recipe(
            "mnist",
            """The default job: a small ViT (patch 4, width 64, depth 6, 0.2 M parameters) on the
            full MNIST from scratch, AdamW + cosine, light affine augmentation, bf16 autocast.

            Command: ``vitkit train`` (this recipe is the default).
            Expected: 98.65 % test top-1 in 7-10 min on 2 vCPUs (docs/experiments.md).""",
            MNIST,
        ),
        Recipe(
            "mnist-long",
            """The longer MNIST recipe aiming at >= 99.5 % test accuracy: a wider ViT (patch 4,
            width 96, depth 6, 0.46 M parameters) trained for 30 epochs with the same affine
            augmentation, label smoothing 0.1 and a lower peak learning rate.

            Command: ``vitkit train --recipe mnist-long``.
            Expected: 99.54 % test top-1 in 45 min on 2 vCPUs (docs/experiments.md).""",
            dataclasses.replace(
                MNIST,
                model_overrides={**MNIST_MODEL, "width": 96, "mlp_dim": 192},
                epochs=30,
                lr=2e-3,
                warmup_epochs=1.0,
                label_smoothing=0.1,
                out_dir="runs/mnist-long",
            ),
        ),
    )
}


def get_recipe(name: str) -> Recipe:
    if name not in RECIPES:
        raise VitkitError(f"unknown recipe '{name}': expected one of {', '.join(RECIPES)}")
    return RECIPES[name]


def smoke(cfg: TrainConfig) -> TrainConfig:
    """A seconds-long version of a recipe for tests: tiny model, one short epoch."""
    overrides = {**cfg.model_overrides, "width": 32, "depth": 2, "num_heads": 2, "mlp_dim": 64}
    return dataclasses.replace(
        cfg,
        model_overrides=overrides,
        epochs=1,
        max_steps=20,
        batch_size=32,
        progress=False,
        out_dir=f"{cfg.out_dir}-smoke",
    )
