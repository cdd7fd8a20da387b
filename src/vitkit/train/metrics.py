"""A run's ``metrics.jsonl`` (one JSON record per line, rank 0 only) and the running means
of the training steps between two records."""

from __future__ import annotations

import contextlib
import json
import os
import time
from pathlib import Path
from typing import Any

from vitkit.checkpoints import atomic_write_text
from vitkit.output_files import NoRoomError, writing


class MetricsLog:
    """``metrics.jsonl`` of a run: appended to by rank 0, cut back to the last checkpoint's
    step when a killed run resumes."""

    def __init__(self, path: Path, is_main: bool = True) -> None:
        self.path = path
        self.is_main = is_main

    def write(self, record: dict[str, Any]) -> None:
        """Append ``record``; a full disk is one line, and a line it cut short is taken back."""
        if not self.is_main:
            return
        line = (json.dumps(record) + "\n").encode()
        size = self.path.stat().st_size if self.path.is_file() else 0
        try:
            with writing(self.path, need=len(line)), open(self.path, "ab") as f:
                f.write(line)
                f.flush()
        except NoRoomError:
            with contextlib.suppress(OSError):
                os.truncate(self.path, size)
            raise

    def clear(self) -> None:
        """A new run starts with no records."""
        if self.is_main:
            self.path.unlink(missing_ok=True)

    def truncate(self, step: int) -> None:
        """On resume, drop records a killed run wrote after its last checkpoint (``step``)."""
        if not self.is_main or not self.path.exists():
            return
        kept = []
        for line in self.path.read_text().splitlines():
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line cut short by the kill
            if rec.get("step", 0) <= step:
                kept.append(line)
        atomic_write_text(self.path, "".join(x + "\n" for x in kept))

    def records(self) -> list[dict[str, Any]]:
        """Every record so far (none if nothing was written)."""
        from vitkit.plotting import read_jsonl

        return read_jsonl(self.path) if self.path.exists() else []


class RunningMeans:
    """Loss and accuracy of the optimizer steps since the last record, and their speed."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.loss = self.acc = 0.0
        self.steps = 0
        self.since = time.perf_counter()

    def add(self, loss: float, acc: float) -> None:
        self.loss, self.acc, self.steps = self.loss + loss, self.acc + acc, self.steps + 1

    def images_per_s(self, batch_size: int) -> float:
        return self.steps * batch_size / (time.perf_counter() - self.since)


def epoch_line(record: dict[str, Any], epochs: int) -> str:
    """An epoch's record as people read it (metrics.jsonl keeps the record itself): the
    accuracies as percentages, the other numbers to four significant digits."""
    shown = []
    for key, value in record.items():
        if key in ("step", "epoch"):
            continue
        if isinstance(value, float) and key.endswith(("top1", "top5", "acc")):
            shown.append(f"{key} {100 * value:.2f} %")
        elif isinstance(value, float):
            shown.append(f"{key} {value:.4g}")
        else:
            shown.append(f"{key} {value}")
    return f"after epoch {record['epoch']}/{epochs}: step {record['step']}, " + ", ".join(shown)
