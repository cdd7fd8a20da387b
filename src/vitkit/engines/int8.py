"""int8 models for CPU inference: ``vitkit export --int8``.

Two engines quantize here, each with its own maintained tool (vitkit writes no int8 kernel):

- ``openvino``: NNCF's post-training quantization of the fp32 ONNX graph (transformer preset:
  int8 weights per channel, int8 activations with calibrated static scales, SmoothQuant),
  saved as OpenVINO IR (``model.xml`` + ``model.bin``).
- ``onnxruntime`` (the default: no calibration data needed, the fastest int8 measured on an
  AVX2 CPU, bench/results/cpu_inference_avx2.md; on a CPU with AVX512-VNNI OpenVINO's int8 is
  1.04-1.8x faster for Ti/16 to B/16 by model and batch, bench/results/cpu_inference.md):
  ONNX Runtime's ``quantize_dynamic``
  (activation scales per batch), or with ``--static`` its QDQ quantization of the MatMul
  weights and inputs (per-channel symmetric int8 weights, uint8 activations with calibrated
  scales; the Conv patch embedding, a hybrid's ResNet, and the Gemm head stay fp32). The file
  is ONNX, so OpenVINO runs it too.

Calibration runs the fp32 model over ``--calib-images`` images of the checkpoint's own dataset
(its training split, in the checkpoint's eval preprocessing), drawn with a fixed seed.
"""

from __future__ import annotations

import ast
import contextlib
import io
import json
import logging
import os
import re
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from vitkit.checkpoints import Checkpoint
from vitkit.engines.backends import ENGINE_FILE, FORMAT, require
from vitkit.engines.dynamic_size import ANTIALIAS_GRAPH, SizeRange
from vitkit.errors import VitkitError
from vitkit.output_files import check_destination, publish, writing

INT8_ENGINES = ("openvino", "onnxruntime")
FILES = {"openvino": ("model.xml", "model.bin"), "onnxruntime": ("model.onnx",)}
CALIB_BATCH = 8


def calibration_images(
    ckpt: Checkpoint,
    data: str | None,
    n: int,
    *,
    split: str = "train",
    data_root: str | None = None,
    seed: int = 0,
) -> Tensor:
    """``n`` images of ``data`` (default: the checkpoint's own dataset) as the model sees them
    (normalised float [n, C, H, W]), drawn at random with ``seed``."""
    from vitkit.data import make_loader, to_model_input
    from vitkit.eval.checkpoint_eval import checkpoint_dataset

    data = data or ckpt.meta.get("dataset")
    if not data:
        raise VitkitError(
            f"{ckpt.path}: the checkpoint names no dataset to calibrate on; pass --calib-data"
        )
    dataset = checkpoint_dataset(ckpt, data, split, data_root)
    loader = make_loader(dataset, min(n, 256), shuffle=True, drop_last=False, seed=seed)
    got: list[Tensor] = []
    for images, _, _ in loader:
        got.append(images[: n - sum(len(g) for g in got)])
        if sum(len(g) for g in got) >= n:
            break
    if not got:
        raise VitkitError(f"{data} ({split}): no images to calibrate on")
    images = torch.cat(got)
    pre = ckpt.preprocess
    return to_model_input(
        images, pre.image_size, pre.channels, pre.mean, pre.std, pre.rescale_factor
    )


def _batches(images: Tensor, size: int = CALIB_BATCH) -> Iterator[np.ndarray]:
    for i in range(0, len(images), size):
        yield images[i : i + size].float().numpy()


def _clean_onnx(src: Path, dst: Path) -> Path:
    """The exporter's graph without its stored intermediate shapes: ONNX Runtime's quantizer
    re-infers them and refuses the exporter's (a known disagreement on the head's shape)."""
    import onnx

    model = onnx.load(str(src))
    del model.graph.value_info[:]
    onnx.save(model, str(dst))
    return dst


SCOPES = "pkg.torch.onnx.name_scopes"  # the exporter's module path of each node


def nodes_of_modules(graph: Path, modules: tuple[str, ...]) -> list[str]:
    """The names of the matmul nodes (MatMul, Gemm) of ``graph`` inside ``modules``: a module's
    path or its ending ("mlp.fc2" names every block's fc2), read from the exporter's metadata."""
    import onnx

    found: dict[str, list[str]] = {m: [] for m in modules}
    layers: set[str] = set()
    for node in onnx.load(str(graph)).graph.node:
        meta = {p.key: p.value for p in node.metadata_props}
        if node.op_type not in ("MatMul", "Gemm") or SCOPES not in meta:
            continue
        scopes = [str(s) for s in ast.literal_eval(meta[SCOPES]) if s]
        layers.update(re.sub(r"^blocks\.\d+\.", "", s) for s in scopes[-2:-1])
        for m in modules:
            if any(s == m or s.endswith("." + m) for s in scopes):
                found[m].append(node.name)
    if not layers:
        raise VitkitError(
            f"--keep-fp32: the exported graph names no modules ({SCOPES}); it needs the ONNX "
            "exporter of torch >= 2.6"
        )
    missing = [m for m, nodes in found.items() if not nodes]
    if missing:
        raise VitkitError(
            f"--keep-fp32 {','.join(missing)}: no matmul of the model lies in such a module "
            f"(its matmul layers: {', '.join(sorted(layers))})"
        )
    return sorted({n for nodes in found.values() for n in nodes})


def position_nodes(graph: Path) -> list[str]:
    """The names of the matmuls of ``graph`` outside every module of the model: an antialiased
    E_pos resampled in a graph of any size (two matrix products,
    :func:`vitkit.models.posemb_resample.antialiased`). They stay fp32: where the exporter
    folds the table into a constant (a small grid), a quantizer takes them for weight matmuls
    and rounds the position table itself to 8 bits."""
    import onnx

    found = []
    for node in onnx.load(str(graph)).graph.node:
        meta = {p.key: p.value for p in node.metadata_props}
        own = [s for s in ast.literal_eval(meta.get(SCOPES, "[]")) if s]  # (its op's name only)
        if node.op_type == "MatMul" and SCOPES in meta and len(own) <= 1:
            found.append(node.name)
    return found


class _NoPreprocessingHint(logging.Filter):
    """ONNX Runtime's quantizer logs "Please consider to run pre-processing before quantization"
    on the root logger at every call (twice for static). vitkit quantizes the exporter's graph
    as it is, and the accuracy it reports is measured so (bench/results/int8_accuracy_*.md):
    the hint is dropped from the output, every other record kept."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "pre-processing before quantization" not in record.getMessage()


@contextlib.contextmanager
def _quiet_quantizer() -> Iterator[None]:
    root, hint = logging.getLogger(), _NoPreprocessingHint()
    root.addFilter(hint)
    try:
        yield
    finally:
        root.removeFilter(hint)


def quantize_onnxruntime(
    fp32: Path, out: Path, calib: Tensor | None, keep_fp32: tuple[str, ...] = ()
) -> None:
    """Static QDQ int8 (``calib`` given) or dynamic int8 (``calib`` None) with ONNX Runtime;
    the matmuls of the modules ``keep_fp32`` (:func:`nodes_of_modules`) stay fp32."""
    require("onnxruntime")
    from onnxruntime import quantization as q

    clean = _clean_onnx(fp32, fp32.with_name("clean.onnx"))
    keep = nodes_of_modules(clean, keep_fp32) if keep_fp32 else []
    keep += position_nodes(clean)
    if calib is None:
        with _quiet_quantizer():
            q.quantize_dynamic(
                str(clean), str(out), weight_type=q.QuantType.QInt8, nodes_to_exclude=keep
            )
        return

    images = calib

    class Reader(q.CalibrationDataReader):
        def __init__(self) -> None:
            self.it = iter([{"pixel_values": b} for b in _batches(images)])

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self.it, None)

    with _quiet_quantizer():
        _quantize_static(q, clean, out, Reader(), keep)


def _quantize_static(q: Any, clean: Path, out: Path, reader: Any, keep: list[str]) -> None:
    q.quantize_static(
        str(clean),
        str(out),
        reader,
        quant_format=q.QuantFormat.QDQ,
        # the blocks' matmuls only: the patch embedding (Conv; a hybrid's whole ResNet) and the
        # head (Gemm) stay fp32. Quantizing them too took a weak shapes-hard model from -0.55 to
        # -1.69 points and from 85.5 % to 70.0 % agreement with fp32 (bench/results/
        # int8_accuracy_shapes_hard.md). For a plain ViT they are a few % of the FLOPs.
        op_types_to_quantize=["MatMul"],
        per_channel=True,
        activation_type=q.QuantType.QUInt8,
        weight_type=q.QuantType.QInt8,
        nodes_to_exclude=keep,
        calibrate_method=q.CalibrationMethod.MinMax,
        extra_options={"WeightSymmetric": True, "ActivationSymmetric": False},
    )


def quantize_openvino(
    fp32: Path, out_xml: Path, calib: Tensor, keep_fp32: tuple[str, ...] = ()
) -> None:
    """NNCF post-training int8 quantization of the fp32 ONNX graph, saved as OpenVINO IR; the
    matmuls of the modules ``keep_fp32`` stay fp32 (NNCF's ignored scope: OpenVINO reads the
    ONNX nodes under their own names)."""
    ov = require("openvino")
    try:
        import nncf
    except ImportError:
        raise VitkitError(
            "int8 quantization for OpenVINO needs NNCF: pip install '.[openvino]' in vitkit's clone"
        ) from None
    keep = nodes_of_modules(fp32, keep_fp32) if keep_fp32 else []
    keep += position_nodes(fp32)
    model = ov.Core().read_model(str(fp32))
    batches = list(_batches(calib))
    dataset = nncf.Dataset(batches)
    from vitkit.engines.signal_stack import kept_signal_stack

    # (NNCF compiles models to gather its statistics: the thread's signal stack kept)
    with contextlib.redirect_stdout(io.StringIO()), kept_signal_stack():  # NNCF's progress bars
        quantized = nncf.quantize(
            model,
            dataset,
            model_type=nncf.ModelType.TRANSFORMER,
            # NNCF counts the dataset's items, here batches of CALIB_BATCH images: the number
            # of images warned "Dataset contains only 16 samples, smaller than the requested
            # subset size 128" at every export (every image was used all the same)
            subset_size=len(batches),
            ignored_scope=nncf.IgnoredScope(names=keep) if keep else None,
        )
    ov.save_model(quantized, str(out_xml), compress_to_fp16=False)


def int8_files(engine: str) -> tuple[str, ...]:
    if engine not in INT8_ENGINES:
        raise VitkitError(f"--int8 writes for {' or '.join(INT8_ENGINES)}, not {engine}")
    return (*FILES[engine], ENGINE_FILE)


def export_int8(
    model: nn.Module,
    ckpt: Checkpoint,
    out: str | Path,
    *,
    engine: str = "openvino",
    calib: Tensor | None,
    calibration: dict[str, Any] | None = None,
    keep_fp32: tuple[str, ...] = (),
    overwrite: bool = False,
    sizes: SizeRange | None = None,
    features: dict[str, Any] | None = None,
) -> Path:
    """Write ``model`` (fp32, eval) quantized to int8 for ``engine`` into the directory ``out``:
    the engine's file(s) and ``engine.json``. ``calib``: normalised calibration images (None:
    ONNX Runtime's dynamic quantization). Every file is written under a temporary name first;
    nothing is written into the checkpoint read, nor over a file without ``overwrite``.
    ``sizes``: a dynamic height and width (vitkit.engines.dynamic_size); ``features``: the
    backbone's features rather than logits (vitkit.engines.feature_export)."""
    from vitkit.eval.checkpoint_eval import check_finite_weights

    names = int8_files(engine)
    check_destination(Path(out), reads=[ckpt.path], writes=names, overwrite=overwrite)
    check_finite_weights(model, ckpt)
    require(engine)
    if engine == "openvino" and calib is None:
        raise VitkitError("the openvino engine quantizes with calibration images only")

    def make(fp32: Path, tmp: Path, taken: SizeRange | None) -> dict[str, Any]:
        own: dict[str, Any] = {}
        if engine == "openvino":
            assert calib is not None
            if taken is not None:  # the sizes where OpenVINO's kernels are exact, before NNCF
                from vitkit.engines.exports import exported_module
                from vitkit.engines.openvino_check import openvino_fp32_check

                cfg = ckpt.model_config
                size = (int(cfg.image_size[0]), int(cfg.image_size[1]))
                module = exported_module(model, features)
                taken, check = openvino_fp32_check(module, fp32, size, taken, str(out))
                check["what"] += ", the graph before NNCF quantized it"
                own = {"sizes": taken.to_dict() if taken else None, "check": check}
            quantize_openvino(fp32, tmp / "model.xml", calib, keep_fp32)
            files = {"openvino": "model.xml"}
        else:
            quantize_onnxruntime(fp32, tmp / "model.onnx", calib, keep_fp32)
            files = {"onnxruntime": "model.onnx", "openvino": "model.onnx"}
        return {
            "engine": engine,
            "precision": "int8",
            "files": files,
            "calibration": calibration or {"method": "dynamic"},
            "keep_fp32": list(keep_fp32),
            **own,
        }

    return write_engine_dir(
        model, ckpt, out, names, make, overwrite=overwrite, sizes=sizes, features=features
    )


def write_engine_dir(
    model: nn.Module,
    ckpt: Checkpoint,
    out: str | Path,
    names: tuple[str, ...],
    make: Callable[[Path, Path, SizeRange | None], dict[str, Any]],
    *,
    overwrite: bool = False,
    sizes: SizeRange | None = None,
    features: dict[str, Any] | None = None,
) -> Path:
    """The engine directory ``out`` of ``model`` (fp32, eval): ``make(fp32_onnx, tmp, sizes)``
    writes the engine's files into ``tmp`` from the model's fp32 ONNX export and returns
    engine.json's own fields (engine, precision, files, ...; a ``check`` of its own replaces
    the fp32 graph's, kept as ``fp32_graph_check``); the source's config, preprocessing,
    classes and dataset are added here. Every file is written under a temporary name first,
    engine.json last; nothing is written into the checkpoint read, nor over a file without
    ``overwrite``. With ``sizes`` the graph takes any height and width in the range; its fp32
    graph is checked against PyTorch at several sizes (engine.json's ``sizes`` and ``check``).
    ``features``: the backbone's named outputs (FeatureOutputs' arguments) instead of logits."""
    from vitkit.engines.exports import exported_module
    from vitkit.engines.onnx_export import export_onnx
    from vitkit.eval.checkpoint_eval import check_finite_weights

    out = Path(out)
    check_destination(out, reads=[ckpt.path], writes=names, overwrite=overwrite)
    check_finite_weights(model, ckpt)
    created = not out.exists()  # removed again if the export fails: no empty directory left
    out.mkdir(parents=True, exist_ok=True)
    for stale in out.glob(f".{out.name}.tmp-*"):  # left by an export killed before its end
        pid = stale.name.rsplit("-", 1)[-1]
        if pid.isdigit() and not _running(int(pid)):
            shutil.rmtree(stale, ignore_errors=True)
    tmp = out / f".{out.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    module = exported_module(model.float().eval(), features)
    described = module.describe() if features is not None else None  # type: ignore[operator]
    outputs = described["outputs"] if described else ["logits"]
    with writing(out):  # no room: one line (the temporary directory goes below)
        try:
            with contextlib.redirect_stdout(io.StringIO()):  # the exporter's progress lines
                fp32 = export_onnx(module, tmp / "fp32.onnx", sizes=sizes, outputs=outputs)
            extra: dict[str, Any] = {"features": described, "outputs": outputs}
            extra["antialias_graph"] = ANTIALIAS_GRAPH
            if sizes is not None:
                sizes, checked = _checked_fp32(module, ckpt, fp32, sizes, out)
                extra.update(checked)
            own = make(fp32, tmp, sizes)
            if "check" in own and "check" in extra:
                extra["fp32_graph_check"] = extra.pop("check")
            extra.update({k: own.pop(k) for k in ("check", "sizes") if k in own})
            info = {
                "format": FORMAT,
                **{k: own[k] for k in ("engine", "precision", "files")},
                "model": ckpt.model_config.to_dict(),
                "preprocess": ckpt.preprocess.to_dict(),
                "class_names": list(ckpt.class_names),
                "meta": {k: v for k, v in ckpt.meta.items() if k in ("dataset", "train_config")},
                "source": str(ckpt.path),
                **{k: v for k, v in own.items() if k not in ("engine", "precision", "files")},
                **extra,
            }
            (tmp / ENGINE_FILE).write_text(json.dumps(info, indent=1))
            for name in names:  # engine.json last: a directory without it is not a model yet
                publish(tmp / name, out / name)
        except BaseException:
            if created:
                shutil.rmtree(out, ignore_errors=True)
            raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return out


def _checked_fp32(
    model: nn.Module, ckpt: Checkpoint, fp32: Path, sizes: SizeRange, out: Path
) -> tuple[SizeRange, dict[str, Any]]:
    """A dynamic-size graph's fp32 export checked against PyTorch at several sizes before it
    is quantized or run at bf16: the range it takes and engine.json's ``sizes`` and ``check``."""
    from vitkit.engines.export_record import checked
    from vitkit.engines.onnx_export import check_at_sizes, ort_model

    graph = ort_model(fp32)
    cfg = ckpt.model_config
    own = (int(cfg.image_size[0]), int(cfg.image_size[1]))

    def measure(points: Any) -> dict[str, float]:
        return check_at_sizes(model, lambda x: graph.run(None, {"pixel_values": x}), points)

    kernel = getattr(cfg, "pos_resample", None)
    taken, check = checked(measure, own, sizes, where=str(out), kernel=kernel)
    check["what"] = "the fp32 graph before the engine's precision"
    assert taken is not None
    return taken, {"sizes": taken.to_dict(), "check": check}


def _running(pid: int) -> bool:
    """Whether a process ``pid`` runs (one of another user counts as running)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def directory_size(path: Path, names: tuple[str, ...]) -> int:
    return sum(os.path.getsize(path / n) for n in names if (path / n).exists())


__all__ = [
    "INT8_ENGINES",
    "calibration_images",
    "directory_size",
    "export_int8",
    "int8_files",
    "nodes_of_modules",
    "quantize_onnxruntime",
    "quantize_openvino",
    "write_engine_dir",
]
