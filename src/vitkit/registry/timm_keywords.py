"""timm's keyword arguments of ``timm.create_model``, as ``vitkit.load`` and
``vitkit.create_model`` take them: each becomes vitkit's setting of the same meaning, or is
refused in one line where vitkit has none (never a quiet other meaning).

=========================  ==================================================================
timm                       vitkit
=========================  ==================================================================
``img_size``               ``image_size`` (an int or (height, width))
``drop_path_rate``         ``drop_path`` (linear in depth, as timm's)
``attn_drop_rate``         ``attn_dropout``
``drop_rate``              ``head_dropout`` (on the head's input, as timm's ``head_drop``)
``pos_drop_rate`` /        ``dropout``: vit_jax's one rate after E_pos, in the MLP and after
``proj_drop_rate``         the attention projection, so both equal or only one of them 0-free
``dynamic_img_size``       accepted: every vitkit model runs any multiple of the patch
``global_pool``            ``pool`` (``"avg"`` → ``"gap"``), with timm's ``fc_norm`` rule: a
                           pooled ``"avg"`` / ``"max"`` / ``"avgmax"`` norms after pooling
                           unless ``fc_norm`` is given
``class_token``,           the same names
``num_classes``,
``fc_norm``
``pretrained_cfg_overlay`` its ``mean``, ``std``, ``interpolation``, ``crop_pct``, ``crop_mode``
                           over the preprocessing; ``file``: the weights (``create_model``
                           with ``pretrained=True``)
``checkpoint_path``,       ``create_model`` only: the weights to load (vitkit never downloads)
``pretrained``
=========================  ==================================================================
"""

from __future__ import annotations

from typing import Any

from vitkit.errors import VitkitError

RENAMED = {
    "img_size": "image_size",
    "drop_path_rate": "drop_path",
    "attn_drop_rate": "attn_dropout",
    "drop_rate": "head_dropout",
}
POOLS = {"token": "token", "avg": "gap", "max": "max", "avgmax": "avgmax", "map": "map", "": "none"}
_OVERLAY = {
    "mean": "mean",
    "std": "std",
    "interpolation": "interpolation",
    "crop_pct": "crop_pct",
    "crop_mode": "resize",
}
_CROP_MODES = {"center": "shortest_edge", "squash": "squash"}
WEIGHTS_KEYWORDS = ("pretrained", "checkpoint_path", "pretrained_cfg_overlay")


def from_timm(kw: dict[str, Any]) -> dict[str, Any]:
    """``kw`` with timm's keywords replaced by vitkit's (see the module); a weights file named
    by ``checkpoint_path`` or ``pretrained_cfg_overlay["file"]`` is left under
    ``"checkpoint_path"`` for ``create_model``, ``pretrained`` dropped after its check."""
    out = dict(kw)
    for timm, ours in RENAMED.items():
        if timm in out:
            if ours in out:
                raise VitkitError(f"{timm} and {ours} are one setting: give one of them")
            value = out.pop(timm)
            out[ours] = tuple(value) if isinstance(value, list) else value
    drops = {k: out.pop(k) for k in ("pos_drop_rate", "proj_drop_rate") if k in out}
    if drops:
        rates = set(drops.values())
        if len(rates) > 1 or "dropout" in out:
            raise VitkitError(
                f"{', '.join(f'{k}={v}' for k, v in drops.items())}: vitkit's dropout is one rate "
                "after the position embeddings, in the MLP and after the attention projection "
                "(vit_jax's); give both equal (or dropout=)"
            )
        out["dropout"] = rates.pop()
    dynamic = out.pop("dynamic_img_size", None)
    if dynamic not in (None, True, False):
        raise VitkitError(f"dynamic_img_size must be True or False, got {dynamic!r}")
    if out.pop("dynamic_img_pad", False):
        raise VitkitError("dynamic_img_pad=True: vitkit runs sizes the patch tiles, never pads")
    if "global_pool" in out:
        pool = out.pop("global_pool")
        if pool not in POOLS:
            raise VitkitError(
                f"global_pool {pool!r}: vitkit pools as {', '.join(map(repr, POOLS))}"
            )
        out["pool"] = POOLS[pool]
        out.setdefault("fc_norm", pool in ("avg", "max", "avgmax"))  # (timm's use_fc_norm)
    overlay = out.pop("pretrained_cfg_overlay", None) or {}
    if not isinstance(overlay, dict):
        raise VitkitError(f"pretrained_cfg_overlay must be a dict, got {type(overlay).__name__}")
    odd = sorted(set(overlay) - set(_OVERLAY) - {"file", "input_size", "num_classes"})
    if odd:
        raise VitkitError(
            f"pretrained_cfg_overlay {', '.join(odd)}: vitkit reads file, mean, std, "
            "interpolation, crop_pct and crop_mode (input_size: give img_size)"
        )
    for key, ours in _OVERLAY.items():
        if key in overlay:
            value = overlay[key]
            out[ours] = _CROP_MODES.get(value, value) if key == "crop_mode" else value
    if "file" in overlay:
        if "checkpoint_path" in out:
            raise VitkitError("checkpoint_path and pretrained_cfg_overlay['file']: give one")
        out["checkpoint_path"] = overlay["file"]
    pretrained = out.pop("pretrained", False)
    if pretrained and "checkpoint_path" not in out:
        raise VitkitError(
            "pretrained=True needs the weights on disk: pretrained_cfg_overlay=dict(file=PATH) "
            "or checkpoint_path=PATH (vitkit never downloads)"
        )
    return out
