"""The caller's settings over what a checkpoint says or vitkit assumed (``vitkit.load(path,
gelu="quick")``, ``-o gelu=quick``): checked and given a source; one that contradicts what
the file's own config states is said in one line."""

from __future__ import annotations

import dataclasses
import warnings
from pathlib import Path
from typing import Any

from vitkit.checkpoints.native.safetensors_io import Checkpoint, check_weights_fit
from vitkit.checkpoints.provenance import Provenance
from vitkit.errors import VitkitError
from vitkit.registry.config_checks import check_fields
from vitkit.registry.model_config import ResNetConfig

PREPROCESS_FIELDS = ("mean", "std", "interpolation", "crop_pct", "resize", "rescale_factor")


def apply_overrides(ckpt: Checkpoint, overrides: dict[str, Any], p: Path) -> Checkpoint:
    """The caller's config fields over what was read or assumed; every field gets a source."""
    prov = ckpt.provenance or Provenance()
    pre = {k: overrides.pop(k) for k in PREPROCESS_FIELDS if k in overrides}
    if pre:
        for k in ("mean", "std"):  # one value for every channel, or one per channel
            if k in pre and not isinstance(pre[k], (list, tuple)):
                pre[k] = (pre[k],) * ckpt.preprocess.channels
        try:
            ckpt.preprocess = dataclasses.replace(ckpt.preprocess, **pre)
        except (TypeError, ValueError) as e:
            raise VitkitError(f"{p}: preprocessing {_spelled(pre)}: {e}") from None
        prov.give(pre)  # (stating mean silences the paper's-preprocessing line)
    if overrides:
        cls = type(ckpt.model_config)  # one message with train's: "unknown model option(s): x"
        what = "ResNet model option(s)" if cls is ResNetConfig else "model option(s)"
        check_fields(cls, overrides, what)
        before = ckpt.model_config.to_dict()
        try:
            ckpt.model_config = ckpt.model_config.replace(**overrides)
        except VitkitError as e:
            raise VitkitError(f"{p}: {_spelled(overrides)}: {e}") from None
        try:
            check_weights_fit(
                ckpt.model_config, ckpt.state_dict, config_source="the settings", source=str(p)
            )
        except VitkitError as e:
            raise VitkitError(f"{p}: {_spelled(overrides)} does not fit its weights: {e}") from None
        _say_contradictions(p, prov, before, ckpt.model_config.to_dict(), overrides)
        prov.give(overrides)
    for f in _TRAINING_ONLY:  # weights never imply these: vitkit's default, to no effect
        if prov.sources.get(f, "weights") == "weights":
            prov.set("default", [f])
    ckpt.provenance = prov.complete(ckpt.model_config.to_dict(), "weights")
    return ckpt


# Settings that do not change a model's outputs in eval mode: a file's value may be replaced.
_TRAINING_ONLY = frozenset({"dropout", "attn_dropout", "drop_path", "head_dropout"})


def _say_contradictions(
    p: Path, prov: Provenance, before: dict[str, Any], after: dict[str, Any], given: dict
) -> None:
    """A setting the file's own config states, replaced by another value: said in one line
    (the outputs change under the file's name; ``-o`` is mostly for what a file does not say,
    but trying a switch on a file is a use too)."""
    for k in sorted(set(given) - _TRAINING_ONLY):
        if prov.sources.get(k) in ("file", "format") and before.get(k) != after.get(k):
            warnings.warn(
                f"{p}: its config states {k}={before.get(k)!r}; the given {k}={given[k]!r} "
                "replaces it, and the outputs are not the file's model's",
                stacklevel=4,
            )


def _spelled(overrides: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in overrides.items())
