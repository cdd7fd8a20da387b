"""Self-supervised pre-training: the :class:`Trainer` with a pretext objective instead of labels.

``Pretrainer(cfg).fit()`` for a :class:`TrainConfig` whose ``objective`` is ``"mpp"`` (the
paper's masked patch prediction) or ``"mae"`` (masked autoencoder). Everything else is the
trainer's: data order, augmentation, bf16 autocast, schedule, clipping, atomic checkpoints and
bitwise-exact resumption. What changes:

- the model is the ViT *without* a head (``num_classes=0``); the objective's own weights (mask
  embedding, prediction head, decoder; ``vitkit.selfsup``) are trained beside it;
- a training step draws its corruption / masking from the trainer's checkpointed augmentation
  generator, so a resumed run corrupts the same patches as the uninterrupted one;
- checkpoints are ordinary vitkit checkpoints of the encoder (``vitkit finetune`` and
  ``vitkit fewshot`` read them); the objective's weights travel in the training state
  (``train_state.safetensors``, keys ``objective.*``), and ``meta["pretrain"]`` records the
  objective and its settings;
- validation and the final report give the pretext loss (and, for classification targets, the
  accuracy of the predicted colours) on held-out images, with a fixed corruption; a PNG shows
  what the objective sees and predicts for a few test images.

Labels are read by the loader but never used.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterator
from typing import Any, cast

import torch
from torch import Tensor, nn

from vitkit.errors import VitkitError
from vitkit.models.vit import VisionTransformer
from vitkit.registry.model_config import ViTConfig, model_config
from vitkit.selfsup import build_objective, objective_config
from vitkit.train import distributed as D
from vitkit.train.trainer import TrainConfig, Trainer

_EVAL_SEED = 1234  # the fixed corruption of validation and test images


class Pretrainer(Trainer):
    """Runs a self-supervised :class:`TrainConfig` (``objective`` mpp or mae)."""

    has_accuracy = False  # set per objective below
    self_supervised = True

    def __init__(self, cfg: TrainConfig) -> None:
        if cfg.objective == "classify":
            raise VitkitError("Pretrainer needs a self-supervised objective (mpp or mae)")
        unsupported = {
            "init_from": cfg.init_from,
            "ema_decay": cfg.ema_decay,
            "mixup_alpha": cfg.mixup_alpha or None,
            "cutmix_alpha": cfg.cutmix_alpha or None,
            "compile": cfg.compile,
            "early_stop": cfg.early_stop,
        }
        given = [k for k, v in unsupported.items() if v is not None]
        if given:
            raise VitkitError(f"pre-training does not support {', '.join(given)} (yet)")
        if D.DistEnv.current().enabled:
            raise VitkitError("self-supervised pre-training runs in one process for now")
        super().__init__(cfg)
        self.objective_cfg = objective_config(cfg.objective, cfg.objective_options)
        assert isinstance(self.model_cfg, ViTConfig)  # build_model_config refuses a ResNet
        self.objective = build_objective(cfg.objective, cfg.objective_options, self.model_cfg)
        self.objective.to(self.device)
        self.has_accuracy = bool(self.objective.is_classification)
        # The encoder and the objective's weights train together.
        self.optimizer = self.build_optimizer(
            nn.ModuleDict({"encoder": self.model, "objective": self.objective})
        )

    def build_model_config(self) -> ViTConfig:
        overrides = dict(self.cfg.model_overrides)
        if overrides.get("num_classes", 0):
            raise VitkitError("a pre-trained encoder has no classification head (num_classes=0)")
        overrides["num_classes"] = 0
        overrides.setdefault("in_chans", self.info.channels)
        overrides.setdefault("image_size", self.cfg.image_size or self.info.image_size)
        cfg = model_config(self.cfg.model, **overrides)
        if not isinstance(cfg, ViTConfig):
            raise VitkitError(
                f"{cfg.short_name} is a ResNet: masked patch prediction and MAE pre-train "
                "a Vision Transformer (plain or hybrid)"
            )
        return cfg

    # ----- one step ----------------------------------------------------------------------

    def pixels(self, x: Tensor) -> Tensor:
        """Model input (normalised) → pixels in [0, 1], the colour targets' scale."""
        pre = self.preprocess
        mean = torch.tensor(pre.mean, device=x.device).view(1, -1, 1, 1)
        std = torch.tensor(pre.std, device=x.device).view(1, -1, 1, 1)
        return ((x.float() * std + mean) / (255 * pre.rescale_factor)).clamp(0, 1)

    def _objective(self, x: Tensor, generator: torch.Generator) -> tuple[Tensor, Tensor, int]:
        with self._autocast():
            return self.objective(self.model, x, self.pixels(x), generator)

    def step_loss(self, x: Tensor, y: Tensor) -> tuple[Tensor, float, int]:
        """The pretext loss of a micro-batch and its hits; the labels ``y`` are never used."""
        self.objective.train()
        loss, correct, counted = self._objective(x, self.aug_generator)
        return loss, float(correct), counted

    def _trained_parameters(self) -> Iterator[nn.Parameter]:
        return itertools.chain(self.model.parameters(), self.objective.parameters())

    # ----- evaluation --------------------------------------------------------------------

    @torch.no_grad()
    def evaluate_pretext(self, dataset: Any) -> dict[str, float]:
        """The pretext loss (and accuracy) on ``dataset`` with a fixed corruption."""
        loader = self._loader(dataset, max(256, self.micro_batch), train=False)
        generator = torch.Generator().manual_seed(_EVAL_SEED)
        self.model.eval()
        self.objective.eval()
        loss_sum, correct, counted, n = 0.0, 0.0, 0, 0
        try:
            for images, _labels, _ in loader:
                if not len(images):
                    continue
                x = self.prepare(images)
                loss, c, m = self._objective(x, generator)
                loss_sum += loss.item() * len(images)
                correct += float(c)
                counted += m
                n += len(images)
        finally:
            self.model.train()
            self.objective.train()
        out = {"loss": loss_sum / max(n, 1)}
        if self.has_accuracy:
            out["acc"] = correct / max(counted, 1)
        return out

    def validate(self) -> dict[str, float]:
        return {f"val_{k}": v for k, v in self.evaluate_pretext(self.val_set).items()}

    # ----- state -------------------------------------------------------------------------

    def train_state(self) -> dict[str, Any]:
        return {**super().train_state(), "objective": dict(self.objective.state_dict())}

    def load_train_state(self, state: dict[str, Any]) -> None:
        from vitkit.checkpoints import load_state_dict_strict

        super().load_train_state(state)
        load_state_dict_strict(self.objective, state["objective"], source="training state")

    def _meta(self) -> dict[str, Any]:
        return {
            **super()._meta(),
            "pretrain": {
                "objective": self.cfg.objective,
                "settings": dataclasses.asdict(self.objective_cfg),
                "objective_parameters": sum(p.numel() for p in self.objective.parameters()),
            },
        }

    # ----- the end -----------------------------------------------------------------------

    def report_header(self, wall_s: float, images_seen: int, train_time: float) -> dict[str, Any]:
        return {
            **super().report_header(wall_s, images_seen, train_time),
            "objective": self.cfg.objective,
            "objective_settings": dataclasses.asdict(self.objective_cfg),
            "objective_params": sum(p.numel() for p in self.objective.parameters()),
        }

    def final_metrics(self, eval_set: Any, split: str) -> dict[str, Any]:
        """Pretext loss (and accuracy) on the test split, and (``run_plots``) ``preview.png``."""
        metrics: dict[str, Any] = {
            f"{split}_{k}": v for k, v in self.evaluate_pretext(eval_set).items()
        }
        if self.cfg.run_plots:
            metrics["preview"] = str(self._preview(eval_set))
        return metrics

    def write_outputs(self, report: dict[str, Any], eval_set: Any, split: str) -> None:
        """report.json and (``run_plots``) curves.png and report.html."""
        from vitkit.train.run_report import write_curves_and_json, write_pretrain_report

        write_curves_and_json(
            self.out, report, self.metrics.records() if self.cfg.run_plots else []
        )
        if not self.cfg.run_plots:
            return
        title = f"{self.cfg.objective} pre-training of {self.model_cfg.short_name}"
        write_pretrain_report(self.out, f"{title} on {self.info.name}")

    @torch.no_grad()
    def _preview(self, dataset: Any, count: int = 8) -> Any:
        """``preview.png``: inputs, what the objective hides, and its predictions."""
        from vitkit.plotting import plot_image_rows

        images = next(iter(self._loader(dataset, count, train=False)))[0]
        x = self.prepare(images)
        self.model.eval()
        self.objective.eval()
        try:
            with self._autocast():
                rows = self.objective.preview(
                    cast(VisionTransformer, self.model),  # a ViT: build_model_config says so
                    x,
                    self.pixels,
                    torch.Generator().manual_seed(_EVAL_SEED),
                )
        finally:
            self.model.train()
            self.objective.train()
        title = f"{self.cfg.objective} on {self.info.name}: {self.model_cfg.short_name}"
        return plot_image_rows(rows, self.out / "preview.png", title=title)
