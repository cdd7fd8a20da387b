"""What a finished run leaves for people: ``confusion_SPLIT.png``, ``curves.png``,
``report.json`` and one ``report.html`` (the run's numbers and figures with the attention
analysis of :mod:`vitkit.analysis`; for a pre-training run its curves and preview). ``vitkit
analyze`` on a run's checkpoint rewrites that same ``report.html``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from torch import nn

from vitkit.checkpoints import atomic_write_text
from vitkit.eval import ClassificationResult
from vitkit.registry.model_config import ModelConfig, PreprocessConfig, ResNetConfig

REPORT_IMAGES = 128  # evaluation images the run report's attention analysis looks at


def write_curves_and_json(out: Path, report: dict[str, Any], records: list[dict]) -> None:
    """``curves.png`` from the metrics records (if any) and ``report.json``."""
    from vitkit.plotting import plot_training_curves

    if records:
        plot_training_curves(records, out / "curves.png", title=str(out))
    atomic_write_text(out / "report.json", json.dumps(report, indent=1))


def plot_final_confusion(
    out: Path,
    result: ClassificationResult,
    class_names: tuple[str, ...],
    split: str,
    model_name: str,
    dataset_name: str,
) -> Path:
    from vitkit.plotting import plot_confusion_matrix

    return plot_confusion_matrix(
        result.confusion,
        class_names,
        out / f"confusion_{split}.png",
        title=f"{model_name} on {dataset_name} ({split}): top-1 {100 * result.top1:.2f}%",
    )


def write_pretrain_report(out: Path, title: str) -> Path:
    """``report.html`` of a pre-training run: its numbers, curves and ``preview.png``."""
    from vitkit.analysis import Figure, Section, training_sections, write_html

    sections = training_sections(out)
    if (out / "preview.png").is_file():
        caption = "Test images, what the objective hides of them, and what it predicts."
        sections.append(Section("Preview", [Figure(out / "preview.png", caption)]))
    return write_html(out / "report.html", title, sections)


def write_run_report(
    out: Path,
    model: nn.Module,
    model_cfg: ModelConfig,
    preprocess: PreprocessConfig,
    eval_set: Any,
    split: str,
    dataset_name: str,
    *,
    sharded: bool = False,
) -> Path:
    """``report.html``: the run's numbers, curves and confusion matrix with the analysis panels
    (PNGs and numbers in ``analysis/``), computed on up to ``REPORT_IMAGES`` evaluation images.
    A ResNet has no attention, and a ``sharded`` (FSDP) model cannot run on rank 0 alone: their
    reports say so instead."""
    from vitkit.analysis import (
        Section,
        analyze_model,
        sample_dataset,
        training_sections,
        write_html,
        write_report,
    )

    note = None
    if isinstance(model_cfg, ResNetConfig):
        note = f"{model_cfg.short_name} is a ResNet: it has no attention to analyse."
    elif sharded:
        note = (
            "The parameters of this FSDP run are sharded over its processes; run "
            f"'vitkit analyze --from {out}' for the attention analysis (it reads the "
            "sharded checkpoint in one process)."
        )
    if note is not None:
        sections = [*training_sections(out), Section("Attention analysis", [note])]
        return write_html(out / "report.html", model_cfg.short_name, sections)
    data = None
    if eval_set is not None:
        n = min(REPORT_IMAGES, len(eval_set))
        data = sample_dataset(
            eval_set, n, preprocess, description=f"{n} {split} images of {dataset_name}"
        )
    result = analyze_model(model, out / "analysis", data)  # type: ignore[arg-type]
    return write_report(out / "report.html", model, result, run_dir=out)  # type: ignore[arg-type]
