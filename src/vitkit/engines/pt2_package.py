"""PyTorch's own deployable package: ``vitkit export CKPT OUT.pt2 --format pt2``.

:func:`export_pt2` runs ``torch.export`` on the model (a dynamic batch; with ``sizes`` a
dynamic height and width, the position embeddings resampled inside the graph) and compiles it
ahead of time with AOTInductor for the CPU (``torch._inductor.aoti_compile_and_package``: C++
compiled by the system's compiler, minutes for B/16). The package is checked against vitkit's
PyTorch model at several sizes after it is written, and its record (source, sizes, precision,
the check: :mod:`vitkit.engines.export_record`) is stored inside it as ``extra/vitkit.json``
(and in AOTInductor's metadata, without the check).

:func:`load_pt2` runs such a package with PyTorch alone: it imports nothing of
``vitkit.models`` or ``vitkit.checkpoints`` (``predict`` / ``eval --from OUT.pt2``), refuses a
size the package does not take in one line, and gives a :class:`Pt2Source` with the
checkpoint's config, preprocessing and classes in place of a checkpoint.
"""

from __future__ import annotations

import json
import logging
import os
import warnings
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from vitkit.engines.dynamic_size import SizeRange
from vitkit.engines.export_record import RECORD_FORMAT
from vitkit.errors import VitkitError

PT2_FORMAT = "vitkit-pt2"
RECORD_FILE = "extra/vitkit.json"


def is_pt2(path: str | Path) -> bool:
    return str(path).endswith(".pt2") and Path(path).is_file()


def export_pt2(
    module: nn.Module,
    out: str | Path,
    info: dict[str, Any],
    sizes: SizeRange | None,
) -> tuple[Path, Any]:
    """Compile ``module`` (fp32, eval; ``module.cfg`` its config) into the package ``out``
    (a temporary name next to it, which the caller publishes) with ``info`` in its metadata;
    returns that path and the loaded package for the check."""
    from vitkit.engines.onnx_export import example_size

    cfg: Any = module.cfg
    out = Path(out)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}.pt2")
    dims: dict[int, Any] = {0: torch.export.Dim("batch", min=1, max=4096)}
    dims.update(sizes.dynamic_shapes() if sizes is not None else {})
    example = torch.zeros(2, cfg.in_chans, *example_size(cfg.image_size, sizes))
    module = module.eval().float()
    import torch._inductor as inductor

    from vitkit.engines.onnx_export import without_log

    configs = {"aot_inductor.metadata": {"vitkit": json.dumps(info)}}
    # torch's deprecation chatter, and inductor's note that the antialiased bicubic (an aten
    # op with no C shim) runs through its proxy executor: the package is checked either way
    ir_log = logging.getLogger("torch._inductor.ir")
    with warnings.catch_warnings(), without_log(ir_log, "%s is missing a c-shim"):
        warnings.simplefilter("ignore")
        try:
            with torch.no_grad():
                program = torch.export.export(module, (example,), dynamic_shapes={"x": dims})
            inductor.aoti_compile_and_package(
                program, package_path=str(tmp), inductor_configs=configs
            )
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
    return tmp, inductor.aoti_load_package(str(tmp))


def add_record(package: Path, info: dict[str, Any]) -> None:
    """``info`` (with its check) into the package as ``extra/vitkit.json``."""
    with zipfile.ZipFile(package, "a") as z:
        top = z.namelist()[0].split("/")[0]
        z.writestr(f"{top}/{RECORD_FILE}", json.dumps(info, indent=1))


def read_record(path: str | Path) -> dict[str, Any]:
    """The record inside a package ``vitkit export --format pt2`` wrote (one line otherwise)."""
    try:
        with zipfile.ZipFile(path) as z:
            name = next((n for n in z.namelist() if n.endswith("/" + RECORD_FILE)), None)
            if name is None:
                raise ValueError("no extra/vitkit.json")
            info = json.loads(z.read(name))
        if not isinstance(info, dict) or info.get("format") != RECORD_FORMAT:
            raise ValueError(f"no format: {RECORD_FORMAT}")
    except (OSError, zipfile.BadZipFile, ValueError, RecursionError) as e:
        raise VitkitError(f"{path}: not a package vitkit export wrote ({e})") from None
    return info


@dataclass
class Pt2Source:
    """What predict and eval read from a checkpoint, for a package (no weights: they are in
    the compiled model)."""

    path: Path
    model_config: Any
    preprocess: Any
    class_names: tuple[str, ...]
    meta: dict[str, Any]
    record: dict[str, Any] = field(default_factory=dict)  # (the package's extra/vitkit.json)
    format: str = PT2_FORMAT
    state_dict: dict[str, Any] = field(default_factory=dict)
    provenance: Any = None


class Pt2Model(nn.Module):
    """A loaded package as a module: ``forward(x [B, C, H, W] float) -> outputs`` (fp32)."""

    def __init__(self, runner: Any, path: Path, sizes: SizeRange | None, own: tuple[int, int]):
        super().__init__()
        self._runner = runner
        self.where = str(path)
        self.sizes = sizes
        self.own = own
        self.engine = "pt2"
        self.precision = "fp32"

    def forward(self, x: Tensor) -> Any:
        size = (int(x.shape[-2]), int(x.shape[-1]))
        if self.sizes is not None:
            self.sizes.check(size, self.where)
        elif size != self.own:
            raise VitkitError(
                f"{self.where}: images {size[0]}x{size[1]}: the package takes "
                f"{self.own[0]}x{self.own[1]} only (export again with --dynamic-size)"
            )
        with torch.inference_mode():
            out = self._runner(x.detach().float().cpu().contiguous())
        return out

    def extra_repr(self) -> str:
        return "engine=pt2 (AOTInductor), precision=fp32"


def load_pt2(path: str | Path) -> tuple[Pt2Model, Pt2Source]:
    """The package at ``path`` as a module and the source it describes; PyTorch alone runs it
    (vitkit's model code is not imported)."""
    from vitkit.registry.model_config import PreprocessConfig, config_from_dict

    info = read_record(path)
    try:
        cfg = config_from_dict(info["model"])
        pre = PreprocessConfig.from_dict(info["preprocess"])
        sizes = SizeRange.from_dict(info["sizes"]) if info.get("sizes") else None
        own = (int(info["image_size"][0]), int(info["image_size"][1]))
    except (KeyError, TypeError, ValueError, IndexError) as e:
        raise VitkitError(f"{path}: its record is incomplete ({e})") from None
    import torch._inductor as inductor

    runner = inductor.aoti_load_package(str(path))
    src = Pt2Source(
        path=Path(path).resolve(),
        model_config=cfg,
        preprocess=pre,
        class_names=tuple(str(c) for c in info.get("class_names", ())),
        meta=dict(info.get("meta", {})),
        record=info,
    )
    return Pt2Model(runner, Path(path), sizes, own), src


__all__ = [
    "PT2_FORMAT",
    "Pt2Model",
    "Pt2Source",
    "add_record",
    "export_pt2",
    "is_pt2",
    "load_pt2",
    "read_record",
]
