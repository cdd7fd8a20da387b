"""Inference engines: a vitkit model run by PyTorch, ONNX Runtime or OpenVINO.

An engine runs a fp32 model (exported to ONNX on the fly) or an int8 model written by
``vitkit export --int8`` (:mod:`vitkit.engines.int8`): a directory holding ``engine.json`` (the
source checkpoint's config, preprocessing, classes and dataset, the engine, the precision, how it
was calibrated) beside the engine's own file (``model.onnx``, or OpenVINO's ``model.xml`` +
``model.bin``). :class:`EngineModel` wraps an engine's loaded model (an ONNX Runtime session,
an OpenVINO compiled model) as an ``nn.Module`` taking and returning tensors, so evaluation and
prediction run it as they run a PyTorch model. Each engine but
PyTorch is an optional extra; a missing one is one line naming it.
"""

from __future__ import annotations

import contextlib
import io
import json
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch
from torch import Tensor, nn

from vitkit.checkpoints import Checkpoint
from vitkit.engines.dynamic_size import ANTIALIAS_GRAPH, SizeRange
from vitkit.errors import VitkitError, why_unreadable
from vitkit.registry.model_config import PreprocessConfig, config_from_dict

ENGINES = ("torch", "onnxruntime", "openvino")
ENGINE_FILE = "engine.json"
FORMAT = "vitkit-engine"
EXTRA = {"onnxruntime": "onnx", "openvino": "openvino"}  # pip install '.[EXTRA]'
MODULE = {"onnxruntime": "onnxruntime", "openvino": "openvino"}


def require(engine: str) -> Any:
    """The engine's Python module, or one line naming the extra that installs it."""
    if engine not in ENGINES:
        raise VitkitError(f"unknown engine {engine!r}; one of {', '.join(ENGINES)}")
    if engine == "torch":
        return torch
    try:
        return __import__(MODULE[engine])
    except ImportError:
        raise VitkitError(
            f"the {engine} engine is not installed: pip install '.[{EXTRA[engine]}]' "
            "in vitkit's clone"
        ) from None


def available(engine: str) -> bool:
    try:
        require(engine)
    except VitkitError:
        return False
    return True


class EngineModel(nn.Module):
    """An engine's loaded model as a module: ``forward(x [B, C, H, W] float) -> logits`` (fp32);
    a features export (``outputs``: its named outputs) returns a tuple, one tensor per name."""

    def __init__(
        self,
        run: Callable[[np.ndarray], list[np.ndarray]],
        engine: str,
        precision: str,
        sizes: SizeRange | None = None,
        where: str = "the engine",
        outputs: tuple[str, ...] = ("logits",),
        naflex: tuple[int, int, int] | None = None,
    ):
        super().__init__()
        self._run = run
        self.engine = engine
        self.precision = precision
        self.sizes = sizes  # an export of any size in a range: others refused in one line
        self.where = where
        self.outputs = outputs
        self.naflex = naflex  # a NaFlex model's (patch rows, patch columns, channels)

    def forward(self, x: Tensor | dict[str, Tensor]) -> Tensor | tuple[Tensor, ...]:
        if isinstance(x, dict):
            return self._packed(x)
        if self.sizes is not None:
            self.sizes.check((x.shape[-2], x.shape[-1]), self.where)
        outs = self._run(np.ascontiguousarray(x.detach().float().cpu().numpy()))
        got = tuple(torch.from_numpy(np.asarray(o, dtype=np.float32)).to(x.device) for o in outs)
        return got if len(self.outputs) > 1 or self.outputs[0] != "logits" else got[0]

    def _packed(self, batch: dict[str, Tensor]) -> Tensor:
        """A NaFlex packed batch (``predict`` / ``eval --max-seq-len``): each image run at its
        own size (the images of one size together), as the NaFlex model runs the batch with
        its padding masks; an export of any size only."""
        if self.naflex is None or self.sizes is None or len(self.outputs) > 1:
            raise VitkitError(
                f"{self.where}: packed patches (--max-seq-len) need an export of a NaFlex "
                "model's logits with --dynamic-size"
            )
        from vitkit.models.naflex_packing import unpack

        images = unpack(batch, self.naflex[:2], self.naflex[2])
        by_size: dict[tuple[int, ...], list[int]] = {}
        for i, img in enumerate(images):
            by_size.setdefault(tuple(img.shape[1:]), []).append(i)
        out: list[Tensor | None] = [None] * len(images)
        for same in by_size.values():
            logits = self.forward(torch.stack([images[i] for i in same]))
            assert isinstance(logits, Tensor)
            for j, i in enumerate(same):
                out[i] = logits[j]
        return torch.stack([o for o in out if o is not None])

    def extra_repr(self) -> str:
        return f"engine={self.engine}, precision={self.precision}"


def onnxruntime_runner(
    path: Path, threads: int | None = None, precision: str = "fp32"
) -> Callable[[Any], Any]:
    """ONNX Runtime's CPU provider running ``path``: ``run(x) -> [outputs]`` (numpy)."""
    if precision != "fp32":  # (its CPU provider has no bf16 matmul)
        raise VitkitError(f"the onnxruntime engine runs fp32 and int8 models, not {precision}")
    ort = require("onnxruntime")
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads or torch.get_num_threads()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    # Idle threads would spin and slow whatever runs next (PyTorch's OMP_WAIT_POLICY=PASSIVE).
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    # No memory plan cached per input shape: with batches of changing size (vitkit serve) the
    # cached plans grew resident memory by half (S/16, batches of 1-32 at random: +49 % against
    # +3 % without) at the same speed at batch 1 and 32 (2-vCPU AMD EPYC, AVX-512).
    so.enable_mem_pattern = False
    session = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    name = session.get_inputs()[0].name

    def run(x: Any) -> Any:
        try:
            return cast(list[Any], session.run(None, {name: x}))
        except Exception as e:  # a model file that loads but is not the model engine.json says
            raise _cannot_run(path, "onnxruntime", x, e) from None

    return run


def openvino_runner(
    path: Path, threads: int | None = None, precision: str = "fp32"
) -> Callable[[Any], Any]:
    """OpenVINO's CPU plugin running ``path`` (``run(x) -> [outputs]``, numpy): exact fp32 (an
    int8 model stays int8, the rest fp32), or with ``precision="bf16"`` its bf16 inference
    precision (refused on a CPU without native bf16, where OpenVINO would silently run fp32)."""
    ov = require("openvino")
    core = ov.Core()
    if precision == "bf16":
        from vitkit.engines.bf16 import check_bf16_cpu

        check_bf16_cpu()
    config = {
        "INFERENCE_NUM_THREADS": threads or torch.get_num_threads(),
        # no pinning: each process of `serve --workers 2` pinned its one thread to the same
        # core and B/16 served half what one process did (a lone process: no difference)
        "ENABLE_CPU_PINNING": False,
        "PERFORMANCE_HINT": "LATENCY",
        "INFERENCE_PRECISION_HINT": "bf16" if precision == "bf16" else "f32",
    }
    from vitkit.engines.signal_stack import kept_signal_stack

    with kept_signal_stack():  # (OpenVINO's own stack, freed out of order, killed a process)
        compiled = core.compile_model(core.read_model(str(path)), "CPU", config)
    request = compiled.create_infer_request()
    n = len(compiled.outputs)

    def run(x: Any) -> Any:
        try:
            request.infer({0: x})
        except Exception as e:  # a model file that loads but is not the model engine.json says
            raise _cannot_run(path, "openvino", x, e) from None
        return [request.get_output_tensor(i).data.copy() for i in range(n)]

    return run


RUNNERS = {"onnxruntime": onnxruntime_runner, "openvino": openvino_runner}


def is_engine_dir(path: str | Path) -> bool:
    """Whether ``path`` is a model written by ``vitkit export --int8`` (holds engine.json)."""
    return (Path(path) / ENGINE_FILE).is_file()


def read_engine_dir(path: str | Path) -> tuple[dict[str, Any], Checkpoint]:
    """``engine.json`` and a :class:`Checkpoint` (no weights) describing the model in it."""
    path = Path(path)
    try:
        info = json.loads((path / ENGINE_FILE).read_text())
        if not isinstance(info, dict) or info.get("format") != FORMAT:
            raise ValueError(f"no format: {FORMAT}")
        names = info.get("class_names", [])
        if not isinstance(names, list):
            raise ValueError(f"class_names is a {type(names).__name__}, not a list")
        ckpt = Checkpoint(
            path=path.resolve(),
            model_config=config_from_dict(info["model"]),
            preprocess=PreprocessConfig.from_dict(info["preprocess"]),
            state_dict={},
            class_names=tuple(str(c) for c in names),
            meta=dict(info.get("meta", {})),
            format=FORMAT,
        )
    except (OSError, KeyError, TypeError, ValueError, VitkitError, RecursionError) as e:
        raise VitkitError(f"{path / ENGINE_FILE}: not a model vitkit export wrote ({e})") from None
    outputs = ckpt.model_config.num_classes
    if ckpt.class_names and len(ckpt.class_names) != outputs:  # as a checkpoint's config.json
        raise VitkitError(
            f"{path / ENGINE_FILE}: {len(ckpt.class_names):,} class_names for a head of "
            f"{outputs} outputs; give one name per output, or none"
        )
    return info, ckpt


def load_engine_dir(
    path: str | Path, engine: str | None = None, threads: int | None = None
) -> tuple[EngineModel, Checkpoint]:
    """The model of an ``export --int8`` directory run by ``engine`` (default: the one it was
    written for; an ONNX file also runs under OpenVINO)."""
    info, ckpt = read_engine_dir(path)
    engine = engine or str(info["engine"])
    files = {str(k): str(v) for k, v in info.get("files", {}).items()}
    if engine == "torch":  # (export --int8 writes no torch model: say what runs it)
        raise VitkitError(
            f"{path}: an exported int8 model runs under onnxruntime or openvino (--engine "
            "onnxruntime or openvino); for torch, give the fp32 checkpoint it was exported from"
        )
    if engine not in files:
        written = ", ".join(files) or "none"
        precision = str(info.get("precision", "int8"))
        how = f"--int8 --engine {engine}" if precision == "int8" else f"--engine {engine}"
        raise VitkitError(
            f"{path}: holds a model for {written}, not {engine}; export it again with {how}"
        )
    precision = str(info.get("precision", "int8"))
    if precision == "bf16" and engine != "openvino":
        raise VitkitError(f"{path}: a bf16 model runs under openvino only, not {engine}")
    if engine == "openvino" and info.get("engine") != "openvino" and info.get("sizes"):
        cfg: Any = ckpt.model_config
        antialiased = cfg.pos_resample == "bicubic-antialias" or (
            cfg.naflex and cfg.naflex_antialias
        )
        if antialiased and info.get("antialias_graph") != ANTIALIAS_GRAPH:
            raise VitkitError(
                f"{path}: an export of any size checked under onnxruntime whose graph resamples "
                "E_pos with an antialiased Resize, which OpenVINO does not compute as PyTorch "
                "away from its own size: run it under onnxruntime, or export it again"
            )
    model_file = Path(path) / files[engine]
    try:
        run = RUNNERS[engine](model_file, threads, "bf16" if precision == "bf16" else "fp32")
    except VitkitError:
        raise
    except Exception as e:  # a truncated or overwritten file: the engine's own parse error
        for f in (model_file, model_file.with_suffix(".bin")) if engine == "openvino" else ():
            if not f.is_file():
                raise VitkitError(f"{f}: missing; export the model again") from None
        reason = why_unreadable(model_file, e)
        if reason.startswith("permission denied") or not model_file.is_file():
            raise VitkitError(f"{model_file}: {reason}") from None
        raise VitkitError(
            f"{_engine_files(model_file, engine)}: {engine} cannot load it ({_first_line(e)}); "
            "the file is damaged or not one vitkit export wrote: export the model again"
        ) from None
    sizes = SizeRange.from_dict(info["sizes"]) if info.get("sizes") else None
    outputs = tuple(str(o) for o in info.get("outputs") or ("logits",))
    cfg = ckpt.model_config
    naflex = (*cfg.patch_size, cfg.in_chans) if getattr(cfg, "naflex", False) else None
    return EngineModel(run, engine, precision, sizes, str(path), outputs, naflex), ckpt


def check_classifier(info: dict[str, Any], path: str | Path) -> None:
    """Refuse, in one line, a features export where class scores are needed (predict, eval,
    serve): its outputs are the backbone's features."""
    if info.get("features"):
        names = ", ".join(str(o) for o in info.get("outputs", []))
        raise VitkitError(
            f"{path}: a features export (outputs {names}), not a classifier; run it from "
            "Python: vitkit.engines.backends.load_engine_dir"
        )


def _cannot_run(path: Path, engine: str, x: Any, e: Exception) -> VitkitError:
    return VitkitError(
        f"{path}: {engine} cannot run it on images of shape {list(x.shape)} ({_first_line(e)}); "
        "the file is not the model its engine.json describes: export the model again"
    )


def _engine_files(model_file: Path, engine: str) -> str:
    """The file an engine reads: for OpenVINO the IR's .xml and its weights' .bin."""
    weights = model_file.with_suffix(".bin")
    return f"{model_file} (+ {weights.name})" if engine == "openvino" else str(model_file)


def _first_line(e: BaseException) -> str:
    """An engine's error in one line (onnxruntime's and OpenVINO's run over many)."""
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    text = lines[0] if lines else type(e).__name__
    return text if len(text) <= 300 else text[:297] + "..."


def fp32_engine_model(model: nn.Module, engine: str, threads: int | None = None) -> nn.Module:
    """``model`` (fp32) run by ``engine``: itself for torch, else exported to ONNX (a temporary
    file) and loaded into the engine, the same numbers to about 1e-5."""
    return engine_model(model, engine, "fp32", threads)


def engine_model(
    model: nn.Module,
    engine: str = "torch",
    precision: str = "fp32",
    threads: int | None = None,
    *,
    compiled: bool = False,
) -> nn.Module:
    """``model`` (fp32, eval) run by ``engine`` at ``precision`` ("fp32" or "bf16") for CPU
    inference, taking and returning fp32 tensors. fp32: itself for torch, else exported to ONNX
    (a temporary file) and loaded into the engine, the same numbers to about 1e-5. bf16 (a CPU
    with native bf16 only, else refused in one line): torch converts the weights to bf16 once,
    in place (``compiled``: also ``torch.compile``, vitkit.engines.bf16); openvino compiles the
    fp32 graph with its bf16 inference precision; onnxruntime has no bf16."""
    from vitkit.engines.bf16 import bf16_model, check_precision

    check_precision(precision)
    if engine == "torch":
        if precision == "bf16":
            return bf16_model(model, compiled=compiled)
        return cast(nn.Module, torch.compile(model)) if compiled else model
    if compiled:
        raise VitkitError("compiled=True is the torch engine's")
    require(engine)
    if precision == "bf16" and engine != "openvino":
        raise VitkitError(f"bf16 runs under the torch or openvino engine, not {engine}")
    from vitkit.engines.onnx_export import export_onnx

    with tempfile.TemporaryDirectory(prefix="vitkit-engine-") as tmp:
        with contextlib.redirect_stdout(io.StringIO()):  # the exporter's progress lines
            path = export_onnx(model, Path(tmp) / "model.onnx")
        run = RUNNERS[engine](path, threads, precision)  # the engine holds the graph now
    return EngineModel(run, engine, precision)


__all__ = [
    "ENGINES",
    "ENGINE_FILE",
    "EngineModel",
    "available",
    "check_classifier",
    "engine_model",
    "fp32_engine_model",
    "is_engine_dir",
    "load_engine_dir",
    "read_engine_dir",
    "require",
]
