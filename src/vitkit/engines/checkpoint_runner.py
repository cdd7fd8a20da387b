"""How a checkpoint runs, decided in one place: the engine, the precision, bf16 weights, an int8
or bf16 engine directory, float8 on a GPU, a compiled .pt2 package, and what a lower precision
is measured against. ``vitkit predict``, ``eval`` and ``serve`` call :func:`runner`, and so can
Python:

    run = vitkit.engines.runner("runs/mnist", fast=True)
    run.model(x)      # the fastest installed engine at the checkpoint's own precision
    print(run.line)   # engine: openvino, fp32 (--fast: the fastest exact fp32 path installed)

The rules:

- A checkpoint runs under ``engine`` ("torch" by default; "onnxruntime" / "openvino": fp32
  through an ONNX export made on the fly) at ``precision``: "fp32" by default (PyTorch's Linear
  layers on oneDNN, :mod:`vitkit.engines.onednn`); "bf16" (a CPU with native bf16): torch
  converts the weights once, openvino compiles at its bf16 precision; "fp8": bf16 on a GPU with
  the large Linear layers' weights in float8 (:mod:`vitkit.engines.float8_inference`). Weights
  holding NaN or inf are refused before any engine is built.
- ``precision="auto"`` (serve's default): bf16 where the CPU has it natively and the model's
  bf16 top-1 agrees with fp32's on synthetic images measured now, else fp32; an engine
  directory or a .pt2 package at its own (:mod:`vitkit.engines.auto_precision`).
- ``fast=True`` without an engine: the fastest engine installed at that precision, from the
  measured tables below (never a lower precision than asked).
- An engine directory (``vitkit export --int8`` / ``--precision bf16``) runs at its own
  precision, under the engine it was written for (``fast``: the fastest of its files
  installed); a .pt2 package (``export --format pt2``) as compiled, with PyTorch alone.
- What the numbers are measured against: an engine directory's fp32 source
  (:func:`source_reference`), the same checkpoint with bf16 weights for fp8
  (:func:`fp8_reference`), the fp32 model for bf16 weights (:func:`bf16_weights`: the copy
  ``eval`` runs beside it).

Every refusal is one line, said before any weights are read where it can be.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vitkit.errors import VitkitError

# What fast picks (bench/results/cpu_inference.md): an exact fp32 path for a checkpoint, the
# fastest engine that runs the file for an int8 model. Never a lower precision than the model's.
# OpenVINO fp32 was the fastest for Ti/16-B/16 at batch 1 and 32 on an AVX-512 host (1.15-1.26x
# ONNX Runtime, more over vitkit's own oneDNN path) and 0.9-1.3x ONNX Runtime on an AVX2 one.
FAST_FP32 = ("openvino", "onnxruntime", "torch")
FAST_INT8 = ("onnxruntime", "openvino")
# fast at bf16 (bench/results/cpu_inference_bf16.md, B/16 at batch 32, a quiet 2-vCPU AMD EPYC
# with AVX512-BF16): OpenVINO at its bf16 precision ran 1.32x PyTorch with bf16 weights, but
# first needs an ONNX export and a compilation (11 s for B/16) that PyTorch's path does not.
# A server (long-lived) takes OpenVINO; a command over a set of images (eval, predict) PyTorch,
# which finishes 128 B/16 images before OpenVINO has started.
FAST_BF16 = ("torch", "openvino")
FAST_BF16_LONG_LIVED = ("openvino", "torch")


@dataclass(frozen=True)
class Runner:
    """What :func:`runner` chose: the runnable ``model`` (tensors in, logits out), the
    ``checkpoint`` it came from (its preprocessing and labels), the ``line`` that says
    which engine and precision run it and why ("engine: torch, fp32 (default; Linear layers
    on oneDNN)"), and with ``precision="auto"`` why that precision."""

    model: Any
    checkpoint: Any
    line: str
    precision: str = "fp32"  # what runs: fp32, bf16, int8, fp8
    precision_why: str = ""  # precision="auto": which and why (vitkit.engines.auto_precision)
    reference: Any = None  # precision="auto" at bf16: the fp32 model it was measured against


def fast_choice(
    precision: str, long_lived: bool, installed: Callable[[str], bool]
) -> tuple[str, str]:
    """The engine ``fast`` picks for a checkpoint at ``precision`` among those ``installed``
    says are there (torch always is), and the words that say why."""
    order: tuple[str, ...]
    if precision == "bf16":
        order = FAST_BF16_LONG_LIVED if long_lived else FAST_BF16
        why = "--fast: the fastest bf16 path installed on this CPU" + (
            " for a server" if long_lived else ""
        )
    else:
        order, why = FAST_FP32, "--fast: the fastest exact fp32 path installed"
    return next(e for e in order if e == "torch" or installed(e)), why


def runner(
    checkpoint: str | Path,
    *,
    engine: str | None = None,
    precision: str | None = None,
    fast: bool = False,
    threads: int | None = None,
    long_lived: bool = False,
    device: str | None = None,
    fp8_recipe: str | None = None,
    fp8_min_params: int | None = None,
    **overrides: Any,
) -> Runner:
    """The model of ``checkpoint`` (a checkpoint, an engine directory or a .pt2 package) run
    by ``engine`` (or what ``fast`` picks) at ``precision`` (None: fp32 for a checkpoint, an
    engine directory's own; "auto": decided here, :mod:`vitkit.engines.auto_precision`, the
    runner's ``precision_why`` saying which and why), with the line that says which engine
    and precision and why (see the module).
    ``long_lived`` (a server): ``fast`` may pick an engine that takes longer to start and runs
    faster. ``threads``: ONNX Runtime's / OpenVINO's. ``device``, ``fp8_recipe``,
    ``fp8_min_params``: where and how ``precision="fp8"`` runs (the first CUDA GPU, tensorwise,
    ``vitkit.float8_layers.FP8_MIN_PARAMS`` where not given). ``overrides``: as
    :func:`vitkit.load` takes them (``arch=``, ``num_heads=``, config fields)."""
    path = str(checkpoint)
    if path.endswith(".pt2"):  # (before the engines' imports: vitkit's model code stays out)
        check_no_overrides(path, "a .pt2 package runs as compiled", overrides)
        return _pt2_runner(path, engine, precision)
    if precision != "fp8" and (fp8_recipe is not None or fp8_min_params is not None):
        raise VitkitError(
            f"fp8_recipe and fp8_min_params set how precision fp8 runs, not {precision or 'fp32'}"
        )
    if precision == "auto":
        kw = dict(engine=engine, fast=fast, threads=threads, long_lived=long_lived, device=device)
        return _auto_runner(path, {**kw, **overrides}, overrides)
    from vitkit.engines.backends import available, engine_model, is_engine_dir, load_engine_dir

    asked = engine
    if is_engine_dir(path):
        from vitkit.engines.backends import check_classifier, read_engine_dir

        info, _ = read_engine_dir(path)
        check_no_overrides(path, "an engine directory runs its exported graph", overrides)
        check_classifier(info, path)
        own = str(info.get("precision", "int8"))
        if precision is not None and precision != own:
            raise VitkitError(
                f"{path}: an exported {own} model runs at {own} only; for --precision "
                f"{precision}, give the checkpoint it was exported from"
            )
        if engine is None and fast:
            files = info.get("files", {})
            engine = next((e for e in FAST_INT8 if e in files and available(e)), None)
        em, ckpt = load_engine_dir(path, engine, threads)
        why = "--fast" if fast and asked is None else "as written"
        return Runner(em, ckpt, f"engine: {em.engine}, {em.precision} ({why})", em.precision)
    from vitkit.checkpoints import load_model

    if precision == "fp8":
        return _fp8_runner(path, engine, fast, device, fp8_recipe, fp8_min_params, overrides)
    precision = precision or "fp32"
    if precision == "bf16":
        from vitkit.engines.bf16 import check_bf16_cpu

        check_bf16_cpu()  # before any weights are read
    model, ckpt = load_model(path, **overrides)
    compiled = False
    if engine is None and fast and getattr(model.cfg, "naflex", False):
        # (an export made here is of one size; packed patches of any size run on torch)
        engine, why = "torch", "--fast: a NaFlex model runs at each image's size on torch"
    elif engine is None and fast:
        engine, why = fast_choice(precision, long_lived, available)
    else:
        why = "as asked" if engine else "default"
        engine = engine or "torch"
    if engine != "torch" or precision == "bf16":
        from vitkit.eval.checkpoint_eval import check_finite_weights

        check_finite_weights(model, ckpt)
        model = engine_model(model, engine, precision, threads, compiled=compiled)
        if engine == "torch":
            why += "; bf16 weights"
    else:
        from vitkit.engines.onednn import onednn_linears

        if onednn_linears(model):  # fp32 CPU inference as fast as ONNX Runtime's (onednn.py)
            why += "; Linear layers on oneDNN"
    return Runner(model, ckpt, f"engine: {engine}, {precision} ({why})", precision)


def check_no_overrides(path: str, what: str, overrides: dict[str, Any]) -> None:
    """Loading options (``arch=``, ``num_heads=``, config fields) read a checkpoint; an exported
    model holds its graph as written, so given with one they would change nothing: refused in
    one line naming them, never ignored."""
    if overrides:
        named = ", ".join(f"{k}={v}" for k, v in overrides.items())
        raise VitkitError(
            f"{path}: {what}; loading options ({named}) change nothing in it: leave them out "
            "(they read a checkpoint, such as the one it was exported from)"
        )


def _pt2_runner(path: str, engine: str | None, precision: str | None) -> Runner:
    """A package of ``export --format pt2`` run by PyTorch alone (vitkit.engines.pt2_package):
    the engine and precision it was compiled with, any other refused in one line."""
    from vitkit.engines.pt2_package import load_pt2

    if engine not in (None, "torch") or precision not in (None, "fp32", "auto"):
        raise VitkitError(
            f"{path}: a .pt2 package runs as compiled (fp32, AOTInductor); for another engine "
            "or precision, give the checkpoint it was exported from"
        )
    model, src = load_pt2(path)
    why = ""
    if precision == "auto":
        from vitkit.engines.auto_precision import auto_choice

        why = auto_choice(True)[1]
    return Runner(model, src, "engine: pt2 (AOTInductor), fp32 (as compiled)", "fp32", why)


def _auto_runner(path: str, kw: dict[str, Any], overrides: dict[str, Any]) -> Runner:
    """``precision="auto"`` (:mod:`vitkit.engines.auto_precision`): an engine directory at its
    own precision; fp32 on a CPU without native bf16; else bf16, measured against the fp32
    model on synthetic images, and fp32 where their top-1 answers differ."""
    import dataclasses

    from vitkit.engines.auto_precision import agreement_why, auto_choice, top1_agreement
    from vitkit.engines.backends import is_engine_dir

    first, why = auto_choice(is_engine_dir(path))
    if first != "bf16":
        return dataclasses.replace(runner(path, precision=first, **kw), precision_why=why)
    run = runner(path, precision="bf16", **kw)
    from vitkit.checkpoints import load_model
    from vitkit.engines.onednn import onednn_linears

    fp32, _ = load_model(path, **overrides)
    onednn_linears(fp32)  # (as the torch engine runs it)
    keep, words = agreement_why(*top1_agreement(fp32, run.model, run.checkpoint.preprocess))
    if keep:
        return dataclasses.replace(run, precision_why=why + words, reference=fp32)
    del run, fp32
    return dataclasses.replace(runner(path, precision="fp32", **kw), precision_why=words)


def fp8_device(device: str | None) -> str:
    """Where ``precision="fp8"`` runs: ``device`` where given (eval's ``--device``), else the
    first visible CUDA GPU (predict, serve), else the CPU (then refused, saying why)."""
    import torch

    if device is not None:
        return str(device)
    return "cuda" if torch.cuda.is_available() else "cpu"


def _fp8_runner(
    path: str,
    engine: str | None,
    fast: bool,
    device: str | None,
    recipe: str | None,
    min_params: int | None,
    overrides: dict[str, Any],
) -> Runner:
    """The checkpoint at ``path`` in bf16 on the GPU with its large Linear layers in float8
    (vitkit.engines.float8_inference), its checkpoint and the engine line; the device and the
    engine are checked before any weights are read."""
    import torch

    from vitkit.checkpoints import load_model
    from vitkit.engines.float8_inference import fp8_model, torchao_quantization
    from vitkit.eval.checkpoint_eval import check_finite_weights
    from vitkit.float8_layers import FP8_MIN_PARAMS, check_fp8_device, check_fp8_settings

    if engine not in (None, "torch"):
        raise VitkitError(f"--precision fp8 runs under the torch engine on a GPU, not {engine}")
    recipe = recipe or "tensorwise"
    min_params = FP8_MIN_PARAMS if min_params is None else min_params
    check_fp8_settings(recipe, min_params)
    gpu_device = torch.device(fp8_device(device))
    check_fp8_device(gpu_device)  # before any weights are read
    torchao_quantization()
    model, ckpt = load_model(path, **overrides)
    check_finite_weights(model, ckpt)
    gpu = fp8_model(model, gpu_device, recipe, min_params)
    why = "--fast: float8 runs under torch only" if fast else "as asked"
    n = len(gpu.float8_layers)
    line = (
        f"engine: torch, fp8 ({recipe}: {n:,} Linear layer{'' if n == 1 else 's'} in float8, "
        f"the rest bf16; {gpu.device}, {torch.cuda.get_device_name(gpu.device)}; {why})"
    )
    return Runner(gpu, ckpt, line, "fp8")


def bf16_weights(precision: str | None, device: str | None, model: Any, tta: bool) -> Any:
    """The copy of ``model`` with bf16 weights that ``eval`` runs beside it (``model`` stays
    the fp32 reference): for ``precision="bf16"`` asked on the CPU for a PyTorch model without
    test-time augmentation; None otherwise (a GPU and test-time augmentation keep autocast; an
    engine runs at its own precision). Refused on a CPU without native bf16."""
    import copy

    from vitkit.engines.backends import EngineModel, engine_model

    if precision != "bf16" or tta or isinstance(model, EngineModel):
        return None
    if str(device or "cpu") != "cpu":
        return None
    from vitkit.engines.bf16 import check_bf16_cpu

    check_bf16_cpu()
    return engine_model(copy.deepcopy(model), "torch", "bf16")


def source_reference(ckpt: Any, **overrides: Any) -> tuple[Any, Any, str]:
    """What an engine directory's numbers are measured against: its fp32 source as the torch
    engine runs it, with that checkpoint (None, None for a checkpoint, or a source no longer
    there), and the source's path ("" where none is recorded)."""
    if ckpt.format != "vitkit-engine":
        return None, None, ""
    from vitkit.engines.backends import read_engine_dir

    info, _ = read_engine_dir(ckpt.path)
    source = str(info.get("source", ""))
    if not source or not Path(source).exists():
        return None, None, source
    from vitkit.checkpoints import load_model
    from vitkit.engines.onednn import onednn_linears

    fp32, src = load_model(source, **overrides)
    onednn_linears(fp32)  # the source as the torch engine runs it
    return fp32, src, source


def fp8_reference(path: str, gpu: Any, **overrides: Any) -> Any:
    """What ``precision="fp8"`` is measured against: the checkpoint at ``path`` with bf16
    weights on the GPU the float8 model ``gpu`` runs on (vitkit.engines.float8_inference)."""
    from vitkit.checkpoints import load_model
    from vitkit.engines.float8_inference import bf16_gpu_model

    model, _ = load_model(path, **overrides)
    return bf16_gpu_model(model, gpu.device)


__all__ = [
    "FAST_BF16",
    "FAST_BF16_LONG_LIVED",
    "FAST_FP32",
    "FAST_INT8",
    "Runner",
    "bf16_weights",
    "fast_choice",
    "fp8_device",
    "fp8_reference",
    "runner",
    "source_reference",
]
