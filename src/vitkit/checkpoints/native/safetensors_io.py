"""vitkit's own checkpoint format: safetensors weights + a JSON that describes them.

A checkpoint is a directory::

    model.safetensors        the model's state dict
    config.json              {"format": "vitkit", "model": ViTConfig, "preprocess": ...,
                              "class_names": [...], "meta": {...}}
    train_state.safetensors  optional: optimizer tensors and RNG states (for --resume)
    train_state.json         optional: the rest of the training state (step, epoch, ...)

Nothing is ever unpickled: tensors go through safetensors, everything else through JSON.

Writes are atomic: a checkpoint is written into a temporary sibling directory, flushed to disk,
then renamed into place; a training run points at its newest checkpoint with a ``LATEST`` file
that is replaced atomically. A process killed at any moment leaves the previous checkpoint and
pointer intact.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode

from vitkit.checkpoints.native.dcp_shards import DCP_DIR, read_model_state
from vitkit.checkpoints.provenance import Provenance
from vitkit.errors import VitkitError, why_unreadable
from vitkit.output_files import disk_bytes, fsync_dir, set_file_mode, writing
from vitkit.registry.counts import count_params
from vitkit.registry.model_config import (
    ModelConfig,
    PreprocessConfig,
    ResNetConfig,
    config_from_dict,
)

FORMAT = "vitkit"
FORMAT_VERSION = 1
WEIGHTS = "model.safetensors"
CONFIG = "config.json"
TRAIN_TENSORS = "train_state.safetensors"
TRAIN_JSON = "train_state.json"
LATEST = "LATEST"


@dataclass
class Checkpoint:
    """A loaded checkpoint: the model's description, its weights and, if saved, training state."""

    path: Path
    model_config: ModelConfig  # a ViTConfig (plain or hybrid ViT) or a ResNetConfig (BiT)
    preprocess: PreprocessConfig
    state_dict: dict[str, Tensor]
    class_names: tuple[str, ...] = ()
    meta: dict[str, Any] = field(default_factory=dict)
    train_state: dict[str, Any] | None = None  # see flatten_state / unflatten_state
    format: str = "vitkit"  # the format it was read from (see vitkit.checkpoints.formats)
    # where each config field came from, and what was assumed (vitkit.checkpoints.provenance)
    provenance: Provenance | None = None


# ---------------------------------------------------------------------------------------------
# Nested training state (optimizer, RNG) <-> flat tensors + JSON


def flatten_state(obj: Any, prefix: str = "") -> tuple[dict[str, Tensor], Any]:
    """Split a nested structure of dicts/lists/tensors/scalars into ``{key: tensor}`` and a
    JSON-able skeleton in which every tensor is replaced by ``{"__tensor__": key}``."""
    tensors: dict[str, Tensor] = {}

    def walk(x: Any, key: str) -> Any:
        if isinstance(x, Tensor):
            tensors[key] = x.detach().cpu().contiguous()
            return {"__tensor__": key}
        if isinstance(x, dict):
            return {
                "__dict__": [
                    [walk(k, f"{key}.k{i}"), walk(v, f"{key}.{i}")]
                    for i, (k, v) in enumerate(x.items())
                ]
            }
        if isinstance(x, (list, tuple)):
            items = [walk(v, f"{key}.{i}") for i, v in enumerate(x)]
            return {"__tuple__": items} if isinstance(x, tuple) else items
        if x is None or isinstance(x, (bool, int, float, str)):
            return x
        raise TypeError(f"cannot store {type(x).__name__} at {key!r} in a checkpoint")

    return tensors, walk(obj, prefix or "s")


def unflatten_state(skeleton: Any, tensors: dict[str, Tensor]) -> Any:
    """Inverse of :func:`flatten_state`."""
    if isinstance(skeleton, dict):
        if "__tensor__" in skeleton:
            return tensors[skeleton["__tensor__"]]
        if "__dict__" in skeleton:
            return {
                unflatten_state(k, tensors): unflatten_state(v, tensors)
                for k, v in skeleton["__dict__"]
            }
        if "__tuple__" in skeleton:
            return tuple(unflatten_state(v, tensors) for v in skeleton["__tuple__"])
        raise VitkitError(f"unrecognised training-state entry {sorted(skeleton)}")
    if isinstance(skeleton, list):
        return [unflatten_state(v, tensors) for v in skeleton]
    return skeleton


# ---------------------------------------------------------------------------------------------
# Atomic writing


def _write_json(path: Path, obj: Any) -> None:
    with open(path, "w") as f:
        json.dump(obj, f, indent=1)
        f.flush()
        os.fsync(f.fileno())


def _write_tensors(path: Path, tensors: dict[str, Tensor]) -> None:
    save_file({k: v.detach().cpu().contiguous() for k, v in tensors.items()}, str(path))
    set_file_mode(path)  # safetensors creates 0600 whatever the umask
    with open(path, "rb") as f:
        os.fsync(f.fileno())


def tensor_bytes(tensors: dict[str, Tensor]) -> int:
    """About the disk space a safetensors file of ``tensors`` takes: the data, a header entry
    per tensor, whole 4 KB blocks."""
    data = sum(t.numel() * t.element_size() + len(k) + 80 for k, t in tensors.items())
    return disk_bytes(data)


def json_bytes(obj: Any) -> int:
    """The disk space :func:`_write_json` takes for ``obj`` (whole 4 KB blocks)."""
    return disk_bytes(len(json.dumps(obj, indent=1).encode()))


def atomic_write_text(path: str | Path, text: str) -> None:
    """Replace ``path`` with ``text`` so that readers see the old or the new file, never half
    (no room for it: one line, no temporary file left, the old file kept)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    data = text.encode()
    with writing(path, tmp, need=disk_bytes(len(data))):
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    fsync_dir(path.parent)


def save_checkpoint(
    path: str | Path,
    model: nn.Module,
    *,
    preprocess: PreprocessConfig | None = None,
    class_names: tuple[str, ...] | list[str] = (),
    meta: dict[str, Any] | None = None,
    train_state: dict[str, Any] | None = None,
) -> Path:
    """Write ``model`` (and optionally training state) as a checkpoint directory at ``path``.

    If ``path`` already exists it is replaced only once the new checkpoint is complete.
    """
    path = Path(path)
    if not hasattr(model, "cfg"):  # (a features-only or backbone wrapper: its .model is one)
        inner = ": save the model it wraps (.model)" if hasattr(model, "model") else ""
        raise VitkitError(f"{path}: a {type(model).__name__} is not a vitkit model{inner}")
    cfg: ModelConfig = model.cfg  # type: ignore[assignment]
    preprocess = preprocess or PreprocessConfig.for_model(cfg)
    if class_names and len(class_names) != cfg.num_classes:  # a file vitkit would not read
        raise VitkitError(
            f"{path}: {len(class_names)} class names for a head of {cfg.num_classes} outputs"
        )
    state_dict = dict(model.state_dict())
    _check_own_config(path, cfg, state_dict)
    path.parent.mkdir(parents=True, exist_ok=True)
    for stale in path.parent.glob(f".{path.name}.tmp-*"):  # left by a killed writer
        shutil.rmtree(stale, ignore_errors=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tensors, skeleton = flatten_state(train_state) if train_state is not None else ({}, None)
    config = {
        "format": FORMAT,
        "version": FORMAT_VERSION,
        "model": cfg.to_dict(),
        "preprocess": preprocess.to_dict(),
        "class_names": list(class_names),
        "meta": meta or {},
    }
    need = tensor_bytes(state_dict) + json_bytes(config)
    if train_state is not None:
        need += tensor_bytes(tensors) + json_bytes(skeleton)
    with writing(path, tmp, need=need):
        tmp.mkdir()
        _write_tensors(tmp / WEIGHTS, state_dict)
        _write_json(tmp / CONFIG, config)
        if train_state is not None:
            _write_tensors(tmp / TRAIN_TENSORS, tensors)
            _write_json(tmp / TRAIN_JSON, skeleton)
        return replace_dir(tmp, path)


def replace_dir(tmp: Path, path: Path) -> Path:
    """Move the finished directory ``tmp`` to ``path`` (fsynced). An existing ``path`` is
    moved aside first and deleted only after the swap, so a kill at any instant leaves the old
    or the new one (``resolve_checkpoint`` finds a ``.NAME.old-*`` left by a kill)."""
    fsync_dir(tmp)
    if os.path.lexists(path):  # (a link too, a broken one included: replaced, not followed)
        old = path.with_name(f".{path.name}.old-{os.getpid()}")
        os.rename(path, old)
        os.rename(tmp, path)
        if old.is_symlink() or not old.is_dir():
            old.unlink()
        else:
            shutil.rmtree(old)
    else:
        os.rename(tmp, path)
    fsync_dir(path.parent)
    return path


# ---------------------------------------------------------------------------------------------
# Reading


def resolve_checkpoint(path: str | Path) -> Path:
    """A checkpoint directory from what a user passes: the directory itself, its
    ``model.safetensors``, or a run directory (its ``checkpoints/LATEST``)."""
    p = Path(path)
    if not p.exists():
        p = _recover_replaced(p)
    if p.is_file():
        if p.suffix != ".safetensors":
            raise VitkitError(
                f"{p}: not a vitkit checkpoint (expected a directory or a .safetensors file)"
            )
        p = p.parent
    for pointer in (p / LATEST, p / "checkpoints" / LATEST):
        if pointer.is_file():
            target = pointer.parent / pointer.read_text().strip()
            if not target.exists():
                target = _recover_replaced(target, pointer)
            if not (target / CONFIG).is_file():
                raise VitkitError(f"{pointer}: points at {target}, which is not a checkpoint")
            return target
    if not (p / CONFIG).is_file() or not ((p / WEIGHTS).is_file() or (p / DCP_DIR).is_dir()):
        raise VitkitError(f"{p}: not a vitkit checkpoint (needs {CONFIG} and {WEIGHTS})")
    return p


def _recover_replaced(path: Path, pointer: Path | None = None) -> Path:
    """A checkpoint killed half-way through being replaced: the old one is in ``.NAME.old-*``."""
    olds = sorted(path.parent.glob(f".{path.name}.old-*")) if path.parent.is_dir() else []
    for old in olds:
        if (old / CONFIG).is_file() and ((old / WEIGHTS).is_file() or (old / DCP_DIR).is_dir()):
            return old
    if pointer is not None:
        raise VitkitError(f"{pointer}: points at {path}, which is not a checkpoint")
    raise VitkitError(f"{path}: no such checkpoint (file or directory not found)")


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise VitkitError(f"{path}: unreadable JSON ({e})") from None
    except RecursionError:  # a hostile file nested deeper than Python's parser goes
        raise VitkitError(f"{path}: unreadable JSON (nested too deeply)") from None


def _read_tensors(path: Path) -> dict[str, Tensor]:
    try:
        return load_file(str(path))
    except (OSError, SafetensorError) as e:
        reason = why_unreadable(path, e)
        raise VitkitError(f"{path}: unreadable safetensors file ({reason})") from None


def load_checkpoint(path: str | Path, *, with_train_state: bool = False) -> Checkpoint:
    """Read a checkpoint (see :func:`resolve_checkpoint` for what ``path`` may be)."""
    p = resolve_checkpoint(path)
    config = _read_json(p / CONFIG)
    if not isinstance(config, dict) or config.get("format") != FORMAT:
        raise VitkitError(f"{p / CONFIG}: not a vitkit checkpoint config (no format: vitkit)")
    version = config.get("version", 0)
    if not isinstance(version, int) or version > FORMAT_VERSION:
        raise VitkitError(
            f"{p / CONFIG}: format version {version!r} is not one this vitkit reads "
            f"(<= {FORMAT_VERSION}); upgrade vitkit"
        )
    try:
        model_cfg = config_from_dict(_with_pos_resample(config["model"], config.get("meta")))
        preprocess = PreprocessConfig.from_dict(config["preprocess"])
        class_names = tuple(str(c) for c in config.get("class_names", ()))
        meta = dict(config.get("meta", {}))
    except (KeyError, TypeError, ValueError, VitkitError) as e:
        raise VitkitError(f"{p / CONFIG}: malformed checkpoint config ({e})") from None
    if class_names and len(class_names) != model_cfg.num_classes:
        raise VitkitError(
            f"{p / CONFIG}: {len(class_names)} class_names for a head of "
            f"{model_cfg.num_classes} outputs; give one name per output, or none"
        )
    train_state = None
    if with_train_state:
        if not (p / TRAIN_JSON).is_file():
            raise VitkitError(f"{p}: has no training state to resume from")
        train_state = unflatten_state(_read_json(p / TRAIN_JSON), _read_tensors(p / TRAIN_TENSORS))
    # One file of weights, or a distributed checkpoint's shards (see checkpoints/native/sharded.py).
    state_dict = _read_tensors(p / WEIGHTS) if (p / WEIGHTS).is_file() else read_model_state(p)
    weights = p / WEIGHTS if (p / WEIGHTS).is_file() else p / DCP_DIR
    check_weights_fit(model_cfg, state_dict, config_source=str(p / CONFIG), source=str(weights))
    return Checkpoint(
        path=p,
        model_config=model_cfg,
        preprocess=preprocess,
        state_dict=state_dict,
        class_names=class_names,
        meta=meta,
        train_state=train_state,
    )


def _with_pos_resample(model: Any, meta: Any) -> Any:
    """A ViT config written before vitkit recorded ``pos_resample`` (how E_pos is resampled at
    another input size, vitkit.checkpoints.posemb_kernels): the kernel its source now gets —
    timm's antialiased bicubic where it was converted from timm or from Dinov2WithRegisters
    (the one Hugging Face class vitkit reads with registers and a learned table), the official
    code's zoom from an ``.npz`` — else the plain bicubic vitkit used."""
    if not isinstance(model, dict) or "pos_resample" in model or "architecture" in model:
        return model  # (one that records it, a malformed one, or a BiT ResNet's)
    origin = meta.get("converted_from") if isinstance(meta, dict) else None
    fmt = origin.get("format") if isinstance(origin, dict) else None
    table = model.get("abs_pos_embed", True) and model.get("rel_pos", "none") != "bias"
    timm = fmt == "timm" or (fmt == "hf" and bool(model.get("num_reg_tokens")))
    table = table and not model.get("naflex", False)
    kernel = "bicubic-antialias" if timm else "zoom" if fmt == "npz" else "bicubic"
    return {**model, "pos_resample": kernel if table else "bicubic"}


def config_diff(a: ModelConfig, b: ModelConfig) -> list[str]:
    """Human-readable differences between two model configs: ``["depth: 12 != 6", ...]``."""
    if type(a) is not type(b):
        return [f"architecture: {a.short_name} != {b.short_name}"]
    da, db = a.to_dict(), b.to_dict()
    return [f"{k}: {da[k]} != {db[k]}" for k in da if da[k] != db[k]]


def _check_fit(
    own: dict[str, Tensor], state_dict: dict[str, Tensor], source: str, keep: Any
) -> None:
    """Raise naming the missing keys, the unexpected keys and the shapes that differ."""
    problems = _fit_problems(own, state_dict, source, keep)
    if problems:
        raise VitkitError(f"{source} does not fit the model: {' | '.join(problems)}")


def _fit_problems(
    own: dict[str, Tensor],
    state_dict: dict[str, Tensor],
    source: str,
    keep: Any,
    own_name: str = "model",
) -> list[str]:
    missing = sorted(k for k in own if keep(k) and k not in state_dict)
    unexpected = sorted(k for k in state_dict if keep(k) and k not in own)
    shapes = sorted(
        f"{k}: {tuple(state_dict[k].shape)} in {source}, {tuple(own[k].shape)} in {own_name}"
        for k in own
        if keep(k) and k in state_dict and state_dict[k].shape != own[k].shape
    )
    problems = []
    if missing:
        problems.append(f"missing keys: {', '.join(missing)}")
    if unexpected:
        problems.append(f"unexpected keys: {', '.join(unexpected)}")
    if shapes:
        problems.append(f"shape mismatches: {'; '.join(shapes)}")
    return problems


def check_weights_fit(
    cfg: ModelConfig, state_dict: dict[str, Tensor], *, config_source: str, source: str
) -> None:
    """Refuse weights that do not fit ``cfg`` before any model is allocated: first the size
    the config declares (an analytic parameter count, so a config that asks for a giant model
    costs nothing), then every key and shape against the model built on the meta device —
    the check :func:`load_state_dict_strict` makes, for converting and inspecting too."""
    declared = count_params(cfg)
    held = sum(t.numel() for t in state_dict.values())
    fields = _size_differences(cfg, state_dict) if declared != held else []
    # A size field the weights contradict, or a model too big to list its keys cheaply: one
    # line naming the field (or the size fields), before anything is allocated.
    if fields or declared > 2 * held + 10_000_000:
        shown = "; ".join(fields) or ", ".join(f"{k} {v}" for k, v in _size_fields(cfg).items())
        raise VitkitError(
            f"{config_source}: declares a model of {declared:,} parameters ({shown}) but "
            f"{source} holds {held:,}"
        )
    _check_fit(_built_state(cfg), state_dict, source, lambda k: True)


def _built_state(cfg: ModelConfig) -> dict[str, Tensor]:
    """The state dict of the model ``cfg`` builds, on the meta device (shapes only)."""
    from vitkit.models.vit import build_model

    with torch.device("meta"), _NoRandomInit():
        return build_model(cfg).state_dict()


def _check_own_config(path: Path, cfg: ModelConfig, state_dict: dict[str, Tensor]) -> None:
    """Refuse to write weights that the config beside them does not describe (a model changed
    by hand after it was built): vitkit would refuse the file when reading it back."""
    problems = _fit_problems(
        _built_state(cfg), state_dict, "the model", lambda k: True, "the config's"
    )
    if problems:
        raise VitkitError(
            f"{path}: not written: the model was changed after it was built and no longer "
            f"matches its config, so the file could not be read back (against the model the "
            f"config builds: {' | '.join(problems)})"
        )


class _NoRandomInit(TorchFunctionMode):
    """Skips the random initialisers while a model is built on the meta device for its shapes
    (their meta kernels import ``torch._dynamo``: seconds, for nothing)."""

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if getattr(func, "__name__", "") in ("normal_", "uniform_"):
            return args[0] if args else kwargs["tensor"]
        return func(*args, **kwargs)


def _size_fields(cfg: ModelConfig) -> dict[str, Any]:
    names = ("layers", "width_factor") if isinstance(cfg, ResNetConfig) else _VIT_SIZE_FIELDS
    return {k: getattr(cfg, k) for k in names}


_VIT_SIZE_FIELDS = ("width", "depth", "mlp_dim", "num_classes")


def _size_differences(cfg: ModelConfig, sd: dict[str, Tensor]) -> list[str]:
    """The ViT size fields whose value the weights contradict: ``["depth 1000 (the weights:
    2)"]`` (empty when none can be told from the keys)."""
    if isinstance(cfg, ResNetConfig):
        return []
    parts = (k.split(".") for k in sd if k.startswith("blocks."))
    blocks = {int(p[1]) for p in parts if len(p) > 2 and p[1].isdigit()}
    seen: dict[str, Any] = {}
    if blocks:
        seen["depth"] = max(blocks) + 1
    if "norm.weight" in sd and sd["norm.weight"].ndim == 1:
        seen["width"] = sd["norm.weight"].shape[0]
    if "blocks.0.mlp.fc1.weight" in sd:
        seen["mlp_dim"] = sd["blocks.0.mlp.fc1.weight"].shape[0]
    seen["num_classes"] = sd["head.weight"].shape[0] if "head.weight" in sd else 0
    return [
        f"{k} {getattr(cfg, k)} (the weights: {v})" for k, v in seen.items() if getattr(cfg, k) != v
    ]


def load_state_dict_strict(
    model: nn.Module,
    state_dict: dict[str, Tensor],
    *,
    source: str = "checkpoint",
    ignore_prefixes: tuple[str, ...] = (),
) -> None:
    """Load weights only if they fit exactly; otherwise say which keys are missing, which are
    unexpected and which shapes differ. Keys under ``ignore_prefixes`` (e.g. ``("head.",)`` to
    start from a checkpoint with another number of classes) must be asked for by name."""
    own = model.state_dict()

    def keep(k: str) -> bool:
        return not any(k.startswith(p) for p in ignore_prefixes)

    _check_fit(own, state_dict, source, keep)
    with torch.no_grad():
        for k, v in state_dict.items():
            if keep(k):
                own[k].copy_(v)
