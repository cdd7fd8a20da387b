"""The training loop: the one place that wires model, data, optimizer, schedule, checkpoints and
evaluation together (the CLI only parses arguments into a :class:`TrainConfig`).

Its parts live next to it, each with one job: ``config`` (what a run is), ``setup`` (data
splits, the fine-tuning checkpoint, the model config), ``checkpoint_manager`` (save, resume,
same-run check), ``metrics`` (``metrics.jsonl``) and ``report`` (the final files). Subclasses
(``Pretrainer``) override small hooks: ``build_model_config``, ``step_loss``,
``load_train_state``, ``validate``, ``final_metrics``, ``write_outputs``.

Reproducibility contract: on CPU with a fixed seed, a run killed at any point and resumed with
``resume=True`` ends with bitwise the same weights as an uninterrupted run. Everything random is
derived from the seed: model init (global RNG seeded before building), the data order (a
generator per epoch), augmentation (a generator per epoch whose state is checkpointed), and
dropout (the global RNG, whose state is checkpointed).

Data parallelism (a process group initialised, e.g. under torchrun; see `train.distributed`):
``batch_size`` stays the global batch of an optimizer step, split over ranks and micro-batches;
each rank reads its slice of every global batch and augments it with the parameters drawn for
the whole batch, so the images and their augmentation do not depend on the world size. The
model is wrapped in DDP or sharded with FSDP2; checkpoints are distributed (DCP) and can be
resumed on any world size, one process included. Dropout draws from the global RNG, reseeded
per step and rank. Only rank 0 writes logs, progress, plots and reports.
"""

from __future__ import annotations

import contextlib
import json
import math
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from vitkit.checkpoints import atomic_write_text, load_checkpoint, save_checkpoint
from vitkit.errors import VitkitError
from vitkit.eval import ClassificationResult, evaluate_classification
from vitkit.eval.tta import JitterTTA
from vitkit.hardware import is_out_of_memory, out_of_memory_message
from vitkit.output_files import check_run_dir
from vitkit.train import distributed as D
from vitkit.train import run_report
from vitkit.train.augment import mix
from vitkit.train.convergence import EARLY_STOP_METRIC, EarlyStopping, train_loss_convergence
from vitkit.train.metrics import RunningMeans, epoch_line
from vitkit.train.run import TrainingRun, _epoch_seed, _step_seed
from vitkit.train.train_config import RESUMABLE_CHANGES, TrainConfig

__all__ = ["RESUMABLE_CHANGES", "TrainConfig", "Trainer"]


class Trainer(TrainingRun):
    """Builds everything a :class:`TrainConfig` describes and runs it: ``Trainer(cfg).fit()``."""

    last_finite_loss: tuple[int, float] | None = None  # (step, loss) of the last update made

    def __init__(self, cfg: TrainConfig) -> None:
        super().__init__(cfg)
        self.early_stopping: EarlyStopping | None = None
        if self.cfg.early_stop is not None:
            if self.val_set is None:
                raise VitkitError(
                    f"{self.out}: early_stop watches the validation loss, and this run has no "
                    "validation split (give --val-size)"
                )
            if self.dist.enabled:
                raise VitkitError("early_stop runs in one process for now (no torchrun)")
            self.early_stopping = EarlyStopping(self.cfg.early_stop)

    # ----- one optimizer step ------------------------------------------------------------

    def _epoch_batches(self) -> Iterator[tuple[Tensor, Tensor, int]]:
        self.train_loader.set_epoch(self.epoch)
        if self.cfg.num_workers == 0:  # augmentation draws from checkpointed generators
            return self.train_loader.iter_from(self.batch_in_epoch)
        # Workers draw from their own generators, seeded per epoch: replay the epoch's first
        # batches (decoding them) so that every worker's generator is where it was.
        it = iter(self.train_loader)
        for _ in range(self.batch_in_epoch):
            next(it)
        return it

    def _epoch_done(self) -> bool:
        usable = len(self.train_loader) - len(self.train_loader) % self.cfg.accum_steps
        return self.batch_in_epoch >= usable

    def step_loss(self, x: Tensor, y: Tensor) -> tuple[Tensor, float, int]:
        """The loss of one prepared micro-batch and its hits: (loss, correct, counted). Hook:
        the pre-trainer's is its objective's."""
        x, target = self._mix(x, y)
        with self._autocast():
            logits = self.forward_model(x)
            loss = F.cross_entropy(logits.float(), target, label_smoothing=self.cfg.label_smoothing)
        return loss, float((logits.argmax(-1) == y).sum()), len(y)

    def train_step(self, micro_batches: list[tuple[Tensor, Tensor]]) -> tuple[float, float]:
        """One optimizer update over ``accum_steps`` micro-batches; returns (loss, accuracy)."""
        lr = self.lr_at(self.step)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        if self.dist.enabled:
            return self._train_step_distributed(micro_batches)
        micro_batches = [(x, y) for x, y in micro_batches if len(y)]  # all images skipped
        total = sum(len(y) for _, y in micro_batches)
        loss_sum, correct, counted, n = 0.0, 0.0, 0, 0
        for images, labels in micro_batches:
            x = self.prepare(self.augment(images))
            loss, hits, m = self.step_loss(x, labels.to(self.device))
            (loss * (len(labels) / total)).backward()  # the mean over all the step's images
            loss_sum += loss.item() * len(labels)
            correct, counted, n = correct + hits, counted + m, n + len(labels)
        return self._optimizer_step(loss_sum, correct, counted, n)

    def _train_step_distributed(
        self, micro_batches: list[tuple[Tensor, Tensor]]
    ) -> tuple[float, float]:
        """`train_step` on one rank: the loss is the mean over the whole global batch."""
        torch.manual_seed(_step_seed(self.cfg.seed, self.step, self.dist.rank))  # dropout
        world = self.dist.world_size
        (total,) = D.all_reduce_sum([sum(len(y) for _, y in micro_batches)], self.dist)
        total = max(total, 1.0)
        loss_sum, correct, counted, n = 0.0, 0.0, 0, 0
        for i, (images, labels) in enumerate(micro_batches):
            weight = len(labels) * world / total  # DDP / FSDP average the ranks' gradients
            if len(labels):
                x = self.prepare(self.augment(images))
                y = labels.to(self.device)
            else:  # every image skipped: a zero-weight forward keeps the collectives in step
                x = torch.zeros(1, *self._input_shape(), device=self.device)
                y = torch.zeros(1, dtype=torch.int64, device=self.device)
            last = i == len(micro_batches) - 1
            with contextlib.ExitStack() as stack:
                if not last:
                    stack.enter_context(D.no_gradient_sync(self.forward_model))
                loss, hits, m = self.step_loss(x, y)
                (loss * weight).backward()
            if len(labels):
                loss_sum += loss.item() * len(y)
                correct, counted, n = correct + hits, counted + m, n + len(y)
        loss_sum, correct, counted_f, n_f = D.all_reduce_sum(
            [loss_sum, correct, counted, n], self.dist
        )
        return self._optimizer_step(loss_sum, correct, int(counted_f), int(n_f))

    def _mix(self, x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
        """Mixup / CutMix (if asked) of a prepared batch: soft targets, else the labels."""
        cfg = self.cfg
        if (cfg.mixup_alpha <= 0 and cfg.cutmix_alpha <= 0) or len(y) < 2:
            return x, y
        soft = F.one_hot(y, self.model_cfg.num_classes).float()
        return mix(
            x,
            soft,
            mixup_alpha=cfg.mixup_alpha,
            cutmix_alpha=cfg.cutmix_alpha,
            generator=self.aug_generator,
        )

    def _input_shape(self) -> tuple[int, int, int]:
        return (self.model_cfg.in_chans, *self.model_cfg.image_size)

    def _trained_parameters(self) -> Iterator[torch.nn.Parameter]:
        """The parameters whose gradients are clipped together (hook: the model's)."""
        return self.model.parameters()

    def _optimizer_step(
        self, loss_sum: float, correct: float, counted: int, n: int
    ) -> tuple[float, float]:
        loss = loss_sum / max(n, 1)
        if not math.isfinite(loss):  # (all-reduced in a distributed run: every rank stops)
            self.optimizer.zero_grad(set_to_none=True)  # the update is never applied
            raise VitkitError(self._divergence(loss))
        if self.cfg.grad_clip:
            torch.nn.utils.clip_grad_norm_(self._trained_parameters(), self.cfg.grad_clip)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        if self.ema is not None:
            self.ema.update(self.model)
        self.step += 1
        self.last_finite_loss = (self.step, loss)
        acc = correct / max(counted, 1) if self.has_accuracy else math.nan
        return loss, acc

    def _divergence(self, loss: float) -> str:
        """The one line that stops a run whose loss is no longer finite."""
        last = (
            f"last finite loss {self.last_finite_loss[1]:.4g} at step {self.last_finite_loss[0]}"
            if self.last_finite_loss is not None
            else "no finite loss since the run (re)started"
        )
        kept = (
            f"the last checkpoint, {self.ckpt_dir / self.checkpoints.latest_name()}, is kept"
            if self.checkpoints.has_checkpoint()
            else "no checkpoint was written"
        )
        return (
            f"{self.out}: training diverged at step {self.step + 1}: the loss is {loss} "
            f"({last}); stopped before applying that update, {kept} (lower --lr or set "
            "--grad-clip)"
        )

    # ----- evaluation --------------------------------------------------------------------

    def evaluate(self, dataset: Any, tta: bool = False) -> ClassificationResult:
        """Evaluate on `dataset`; in a distributed run every rank evaluates its share. ``tta``:
        with the run's test-time augmentation (``tta_shift/rotate/zoom``), if it has one."""
        per_rank = max(256, self.micro_batch)
        if self.dist.enabled:  # small sets: an even share per rank rather than all on rank 0
            per_rank = min(per_rank, math.ceil(len(dataset) / self.dist.world_size))
        loader = self._loader(dataset, per_rank, train=False)

        def run(model: torch.nn.Module, batches: Any) -> ClassificationResult:
            return evaluate_classification(
                model,
                batches,
                self.info.num_classes,
                device=self.device,
                prepare=self.prepare,
                autocast_dtype=torch.bfloat16 if self.cfg.precision in ("bf16", "fp8") else None,
                progress=self.cfg.progress and self.dist.is_main,
            )

        jitter = (self.cfg.tta_shift, self.cfg.tta_rotate, self.cfg.tta_zoom)
        if tta and any(jitter):
            if self.dist.enabled:
                raise VitkitError("tta_*: test-time augmentation runs in one process only")
            return run(JitterTTA(self.model, *jitter), loader)
        if not self.dist.enabled:
            return run(self.model, loader)

        def dummy() -> Tensor:
            return torch.zeros(1, *self._input_shape(), device=self.device)

        return D.evaluate_sharded(
            run,
            self.model,  # DDP: the module itself (no collectives); FSDP: the sharded model
            loader,
            self.info.num_classes,
            self.dist,
            collective_forward=self.strategy == "fsdp",
            dummy_input=dummy,
        )

    def validate(self) -> dict[str, float]:
        """The metrics of the held-out slice recorded after every epoch (hook)."""
        res = self.evaluate(self.val_set)
        return {"val_loss": res.loss, "val_top1": res.top1, "val_top5": res.top5}

    # ----- the loop ----------------------------------------------------------------------

    def fit(self, on_epoch_end: Callable[[Trainer, dict[str, Any]], None] | None = None) -> dict:
        """Train to the end (or ``max_steps``), then evaluate on the test split.

        Returns the final report (also written to ``out_dir/report.json``).
        """
        from vitkit.progress import progress

        cfg = self.cfg
        main = self.dist.is_main
        check_run_dir(self.out)  # never inside a run or a checkpoint (nor one itself)
        self.out.mkdir(parents=True, exist_ok=True)
        resumed = cfg.resume and self.restore()
        if not resumed:
            if self.checkpoints.has_checkpoint():  # (restore() found none if resume was asked)
                raise VitkitError(
                    f"{self.out}: already holds a run; pass --resume to continue it or "
                    "choose another --out-dir"
                )
            D.barrier(self.dist)  # every rank has checked before rank 0 writes anything
            self.metrics.clear()
            if cfg.resume and main:  # (killed before its first checkpoint)
                print(
                    f"{self.out}: no checkpoint yet; starting the run from its first step "
                    "with its saved settings",
                    file=sys.stderr,
                )
        if main:
            atomic_write_text(self.out / "train_config.json", json.dumps(cfg.to_dict(), indent=1))
        # elapsed_s in the epoch records: training wall time, a resumed run going on from its
        # last record's (accuracy against time: docs/experiments.md)
        start = time.perf_counter()
        before = max((r.get("elapsed_s", 0.0) for r in self.metrics.records()), default=0.0)
        images_seen = 0
        train_time = 0.0
        while self.epoch < cfg.epochs and self.step < self.total_steps and not self.stopped_early:
            if self.batch_in_epoch == 0:
                self.aug_generator.manual_seed(_epoch_seed(cfg.seed, self.epoch, 1))
            self.model.train()
            done = self.batch_in_epoch // cfg.accum_steps
            bar = progress(
                total=min(self.steps_per_epoch, done + self.total_steps - self.step),
                initial=done,
                desc=f"epoch {self.epoch + 1}/{self.epochs_planned}",
                enabled=cfg.progress and main,
            )
            pending: list[tuple[Tensor, Tensor]] = []
            means = RunningMeans()
            skipped = 0
            t_epoch = time.perf_counter()  # throughput includes waiting for data
            for images, labels, n_skipped in self._epoch_batches():
                skipped += n_skipped
                pending.append((images, labels))
                self.batch_in_epoch += 1
                if len(pending) < cfg.accum_steps:
                    continue
                try:
                    loss, acc = self.train_step(pending)
                except (RuntimeError, MemoryError) as e:  # CUDA's OutOfMemoryError, the CPU's
                    if not is_out_of_memory(e):
                        raise
                    raise VitkitError(
                        f"{self.out}: "
                        + out_of_memory_message(
                            e, self.device, cfg.batch_size, cfg.accum_steps, len(pending[0][1])
                        )
                    ) from None
                images_seen += sum(len(y) for _, y in pending) * self.dist.world_size
                pending = []
                means.add(loss, acc)
                bar.update(1)
                if self.step % 10 == 0 or self.step == self.total_steps or self._epoch_done():
                    shown = {"loss": f"{loss:.3f}"}
                    if self.has_accuracy:
                        shown["acc"] = f"{acc:.3f}"
                    bar.set_postfix(
                        **shown,
                        lr=f"{self.lr_at(self.step - 1):.2e}",
                        img_s=f"{images_seen / (train_time + time.perf_counter() - t_epoch):.0f}",
                    )
                if self.step % cfg.log_every == 0:
                    self._log_train(means)
                if self.step >= self.total_steps:
                    break
                if cfg.ckpt_every and self.step % cfg.ckpt_every == 0 and not self._epoch_done():
                    self.save()  # (the end of an epoch saves anyway)
            train_time += time.perf_counter() - t_epoch
            bar.close()
            if means.steps:  # the steps since the last record
                self._log_train(means)
            if self._epoch_done():
                self.epoch += 1
                self.batch_in_epoch = 0
            record: dict[str, Any] = {"step": self.step, "epoch": self.epoch}
            record["elapsed_s"] = round(before + time.perf_counter() - start, 3)
            if self.dist.enabled:
                (skipped_all,) = D.all_reduce_sum([skipped], self.dist)
                skipped = int(skipped_all)
            if skipped:
                record["skipped_images"] = skipped
            if self.val_set is not None:
                record.update(self.validate())
            if self.early_stopping is not None:
                self._watch(record)
            self.metrics.write(record)
            self.save()
            if cfg.progress and main:
                print(epoch_line(record, self.epochs_planned), file=sys.stderr)
            if on_epoch_end is not None:
                on_epoch_end(self, record)
        return self.finish(time.perf_counter() - start, images_seen, train_time)

    def _log_train(self, means: RunningMeans) -> None:
        """A metrics record of the training steps since the last one."""
        record = {
            "step": self.step,
            "epoch": self.epoch + self.batch_in_epoch / len(self.train_loader),
            "train_loss": means.loss / means.steps,
            "train_acc": means.acc / means.steps,
            "lr": self.lr_at(self.step - 1),
            "images_per_s": means.images_per_s(self.cfg.batch_size),
        }
        if not self.has_accuracy:
            del record["train_acc"]
        self.metrics.write(record)
        means.reset()

    # ----- early stopping ----------------------------------------------------------------

    @property
    def stopped_early(self) -> bool:
        return self.early_stopping is not None and self.early_stopping.stopped

    def _watch(self, record: dict[str, Any]) -> None:
        """One evaluation for early stopping: a new best's weights go to ``OUT/best``."""
        assert self.early_stopping is not None
        if self.early_stopping.update(record[EARLY_STOP_METRIC], self.epoch):
            save_checkpoint(
                self.out / "best",
                self.model,
                preprocess=self.preprocess,
                class_names=self._class_names(),
                meta={**self._meta(), f"best_{EARLY_STOP_METRIC}": record[EARLY_STOP_METRIC]},
            )
            record["best"] = True
        if self.early_stopping.stopped:
            record["early_stopped"] = True

    def _restore_best(self) -> dict[str, Any]:
        """Load the best evaluation's weights for the final evaluation; what the report says."""
        es = self.early_stopping
        assert es is not None
        if (self.out / "best").is_dir():
            best = load_checkpoint(self.out / "best")
            self.model.load_state_dict(best.state_dict)
        return {
            "early_stop": {"metric": EARLY_STOP_METRIC, "patience": es.patience},
            "early_stopped": es.stopped,  # False: the budget ended first
            "stopped_epoch": self.epoch,  # epochs trained
            "best_epoch": es.best_epoch,  # the final metrics are of the weights after it
            f"best_{EARLY_STOP_METRIC}": es.best if math.isfinite(es.best) else None,
        }

    def train_state(self) -> dict[str, Any]:
        state = super().train_state()
        if self.early_stopping is not None:
            state["early_stop"] = self.early_stopping.state_dict()
        return state

    def load_train_state(self, state: dict[str, Any]) -> None:
        super().load_train_state(state)
        if self.early_stopping is not None:
            self.early_stopping.load_state_dict(state["early_stop"])

    # ----- the end -----------------------------------------------------------------------

    def report_header(self, wall_s: float, images_seen: int, train_time: float) -> dict[str, Any]:
        """What every run's report.json starts with: model, data, steps, time, speed."""
        header = {
            "out_dir": str(self.out),
            "model": self.model_cfg.short_name,
            "model_config": self.model_cfg.to_dict(),
            "num_params": sum(p.numel() for p in self.model.parameters()),
            "dataset": self.info.name,
            "steps": self.step,
            "epochs": self.epoch,
            "wall_s": wall_s,
            "train_images_per_s": images_seen / train_time if train_time else None,
            "precision": self.cfg.precision,
            "threads": torch.get_num_threads(),
        }
        if self.dist.enabled:
            header["distributed"] = {"world_size": self.dist.world_size, "strategy": self.strategy}
        return header

    def finish(self, wall_s: float, images_seen: int, train_time: float) -> dict[str, Any]:
        """The final evaluation (test split, else val), the run's files, and its report."""
        report = self.report_header(wall_s, images_seen, train_time)
        if self.dist.is_main:
            report["convergence"] = train_loss_convergence(self.metrics.records())
        if self.early_stopping is not None:
            report.update(self._restore_best())
        split = "test" if self.test_set is not None else "val"
        eval_set = self.test_set if self.test_set is not None else self.val_set
        if eval_set is not None:
            report.update(self.final_metrics(eval_set, split))
        if self.dist.is_main:  # (every rank evaluated its share; rank 0 writes)
            self.write_outputs(report, eval_set, split)
        # Every rank leaves together, so that none tears its process group down (and exits)
        # while rank 0, which hosts the rendezvous store, is still writing.
        D.barrier(self.dist)
        return report

    def final_metrics(self, eval_set: Any, split: str) -> dict[str, Any]:
        """Top-k, per-class accuracy (and the same for the EMA weights) on ``eval_set``, with
        its confusion matrix drawn (hook: the pre-trainer's pretext metrics)."""
        res = self.evaluate(eval_set, tta=True)
        metrics: dict[str, Any] = {f"{split}_{k}": v for k, v in res.metrics().items()}
        metrics["per_class_accuracy"] = [
            None if math.isnan(a) else a for a in res.per_class_accuracy
        ]
        if self.dist.is_main and self.cfg.run_plots:
            run_report.plot_final_confusion(
                self.out,
                res,
                self.info.class_names,
                split,
                self.model_cfg.short_name,
                self.info.name,
            )
        if self.ema is not None:  # the Polyak-averaged weights, evaluated the same way
            raw = {k: v.clone() for k, v in self.model.state_dict().items()}
            self.model.load_state_dict(self.ema.averaged_model(self.model).state_dict())
            ema_res = self.evaluate(eval_set, tta=True)
            metrics.update({f"ema_{split}_{k}": v for k, v in ema_res.metrics().items()})
            if self.dist.is_main:
                save_checkpoint(
                    self.out / "ema",
                    self.model,
                    preprocess=self.preprocess,
                    class_names=self.info.class_names,
                    meta={**self._meta(), "ema_decay": self.cfg.ema_decay},
                )
            self.model.load_state_dict(raw)
        return metrics

    def write_outputs(self, report: dict[str, Any], eval_set: Any, split: str) -> None:
        """Rank 0: report.json and (``run_plots``) curves.png and report.html (hook)."""
        records = self.metrics.records() if self.cfg.run_plots else []
        run_report.write_curves_and_json(self.out, report, records)
        if not self.cfg.run_plots:
            return
        run_report.write_run_report(
            self.out,
            self.model,
            self.model_cfg,
            self.preprocess,
            eval_set,
            split,
            self.info.name,
            sharded=self.strategy == "fsdp",
        )
