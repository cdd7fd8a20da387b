"""Issue 28's late-SAM probe: mnist-best whose last LATE epochs take sharpness-aware steps
(Foret et al. 2021, "Sharpness-Aware Minimization"; SAM applied only late in training, as
Zhou et al. 2025, arXiv:2410.10373, found enough for most of its effect): the gradient at the
weights moved by RHO * g / ||g||, on the same augmented images, then the recipe's clipping and
AdamW step.
A SAM step costs two forward-backward passes, so 19 epochs with the last 4 under SAM cost about
23 plain epochs (the recipe has 22). Not a vitkit training option: this script replaces the
trainer's step for the run it starts.

    python bench/mnist_sam.py RHO LATE [vitkit train args]
    python bench/mnist_sam.py 0.1 4 --epochs 19 --seed 1 --threads 1 --no-progress --out-dir DIR
"""

from __future__ import annotations

import os
import sys
from typing import Any

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402

from vitkit.engines.allocator import keep_freed_memory  # noqa: E402
from vitkit.train.trainer import Trainer  # noqa: E402

_plain_step = Trainer.train_step


def sam_step(self: Trainer, micro_batches: list[Any], rho: float, late: int) -> tuple[float, float]:
    if self.epoch < self.cfg.epochs - late or len(micro_batches) != 1 or self.dist.enabled:
        return _plain_step(self, micro_batches)
    if not getattr(self, "_sam_said", False):
        print(
            f"SAM from step {self.step} (epoch {self.epoch + 1} of {self.cfg.epochs})",
            file=sys.stderr,
        )
        self._sam_said = True  # type: ignore[attr-defined]
    for group in self.optimizer.param_groups:
        group["lr"] = self.lr_at(self.step)
    images, labels = micro_batches[0]
    x, y = self.prepare(self.augment(images)), labels.to(self.device)
    loss, hits, m = self.step_loss(x, y)
    loss.backward()
    params = [p for p in self.model.parameters() if p.grad is not None]
    with torch.no_grad():
        norm = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in params]))
        moves = [p.grad * (rho / (norm + 1e-12)) for p in params]
        torch._foreach_add_(params, moves)
    self.optimizer.zero_grad(set_to_none=True)
    sharp, _, _ = self.step_loss(x, y)  # the same images at the moved weights
    sharp.backward()
    with torch.no_grad():
        torch._foreach_sub_(params, moves)
    return self._optimizer_step(loss.item() * len(y), hits, m, len(y))


def main() -> None:
    rho, late, args = float(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]
    keep_freed_memory()
    Trainer.train_step = lambda self, mb: sam_step(self, mb, rho, late)  # type: ignore[method-assign]
    from vitkit.cli import main as vitkit_main

    sys.exit(vitkit_main(["train", "--recipe", "mnist-best", *args]))


if __name__ == "__main__":
    main()
