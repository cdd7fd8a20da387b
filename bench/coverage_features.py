"""bench/coverage.py's features column: vitkit's ``forward_intermediates`` against timm's on the
same weights (the small float64 copy a row already loaded), for every setting a dense head asks:
block indices (all, the last n, chosen ones, negative), ``output_fmt`` NCHW and NLC, ``norm``
off and on, prefix tokens apart or not, ``intermediates_only``, ``stop_early``, and
``feature_info``; at the copy's own input size and, where timm's module runs another size
(``dynamic_img_size``), at a second, non-square one, where vitkit resamples E_pos on the fly
with the kernel it read from the timm folder (timm's antialiased bicubic, ``pos_resample``).
Also used by tests/test_features.py.

A row is ``exact`` (every tensor within ``EXACT`` of timm's, relative to its max, same
structure and shapes), ``differ`` (the worst setting named), ``refused`` (a one-line
VitkitError) or ``crashed``; settings timm's own module cannot run (eva.py's prefix tokens on
a model without any) are skipped and counted.
"""

from __future__ import annotations

import copy
import itertools
from typing import Any

import torch

from vitkit.errors import VitkitError

EXACT = 1e-8  # relative to max |timm's tensor|, float64: the logits' tolerance
# RoPE at the second size: timm's dynamic_img_size path takes the angles in float64 and rounds
# sin / cos to float32, its fixed-size tables and vitkit take them in float32 (tests/test_rope.py);
# measured up to 1.9e-8 on the blocks' (unnormed) outputs
EXACT_ROPE_SECOND = 1e-7
INDEX_SETS: tuple[Any, ...] = (None, 1, 2, [0], [-1], [1, 0], [0, -1])
SECOND_GRID = (3, 4)  # patches (rows, columns) of the second input size


def _flat(out: Any) -> list[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        return [out]
    return [t for item in out for t in _flat(item)]


def _shape(out: Any) -> Any:
    if isinstance(out, torch.Tensor):
        return tuple(out.shape)
    return [_shape(item) for item in out]


def settings() -> list[dict[str, Any]]:
    """Every combination of indices, format, norm and prefix tokens, plus intermediates_only
    and stop_early on two of them."""
    grid = itertools.product(INDEX_SETS, ("NCHW", "NLC"), (False, True), (False, True))
    out = [
        {"indices": i, "output_fmt": f, "norm": n, "return_prefix_tokens": p} for i, f, n, p in grid
    ]
    out.append({"indices": [0], "intermediates_only": True, "norm": True})
    out.append({"indices": [0], "stop_early": True, "intermediates_only": True})
    return out


def compare(ref: Any, ours: Any, x: torch.Tensor, tol: float = EXACT) -> dict[str, Any]:
    """``{"rel": worst relative difference, "settings": run, "skipped": timm could not}`` or
    ``{"differ": what, "setting": ...}``: every setting of :func:`settings` on ``x``."""
    worst, run, skipped = 0.0, 0, 0
    for kw in settings():
        try:
            with torch.no_grad():
                want = ref.forward_intermediates(x, **kw)
        except Exception:  # noqa: BLE001 - timm's own module cannot run this setting
            skipped += 1
            continue
        with torch.no_grad():
            got = ours.forward_intermediates(x, **kw)
        if _shape(got) != _shape(want):
            return {"differ": f"shapes {_shape(got)} vs timm's {_shape(want)}", "setting": kw}
        for a, b in zip(_flat(got), _flat(want)):
            rel = ((a - b).abs().max() / b.abs().max().clamp(min=1e-300)).item()
            if not rel <= tol:
                return {"differ": f"rel {rel:.1e}", "setting": kw}
            worst = max(worst, rel)
        run += 1
    return {"rel": worst, "settings": run, "skipped": skipped}


def dynamic_copy(timm: Any, name: str, args: dict[str, Any], ref: Any) -> Any:
    """timm's ``name`` with ``dynamic_img_size=True`` and ``ref``'s weights, or None where its
    module has no such switch (NaFlexVit runs any size as it is)."""
    if type(ref).__name__ == "NaFlexVit":
        return ref
    try:
        other = timm.create_model(name, **args, dynamic_img_size=True).double().eval()
        other.load_state_dict(ref.state_dict(), strict=True)
    except Exception:  # noqa: BLE001 - the module cannot run another size
        return None
    return other


def check(
    timm: Any, name: str, args: dict[str, Any], ref: Any, ours: Any, x: torch.Tensor
) -> dict[str, Any]:
    """The features row of one timm entry: ``ref`` timm's float64 model, ``ours`` vitkit's
    float64 model of the same weights, ``x`` images at the copy's own size."""
    ref = copy.deepcopy(ref).eval()
    row: dict[str, Any] = {}
    try:
        info = [(d["num_chs"], d["reduction"], d["module"]) for d in ref.feature_info]
        mine = [(d["num_chs"], d["reduction"], d["module"]) for d in ours.feature_info]
        if info != mine:
            return {"status": "differ", "reason": f"feature_info {mine} vs timm's {info}"}
        row["own"] = compare(ref, ours, x)
        if "differ" in row["own"]:
            return {
                "status": "differ",
                "reason": f"{row['own']['differ']} at {row['own']['setting']}",
            }
        other = dynamic_copy(timm, name, args, ref)
        if other is None:
            row["second"] = "timm's module runs one size"
        else:
            stride = (x.shape[-2] // 2, x.shape[-1] // 2)  # (the copies have a 2x2 grid)
            size = (SECOND_GRID[0] * stride[0], SECOND_GRID[1] * stride[1])
            g = torch.Generator().manual_seed(2)
            x2 = torch.randn(2, x.shape[1], *size, generator=g, dtype=x.dtype)
            tol = EXACT_ROPE_SECOND if ours.rope is not None else EXACT
            got2 = compare(other, ours, x2, tol)  # E_pos resampled on the fly, as timm's
            row["second"] = {"size": list(size), "tol": tol, **got2}
            if "differ" in row["second"]:
                got = row["second"]
                return {
                    "status": "differ",
                    "reason": f"{size}: {got['differ']} at {got['setting']}",
                }
    except VitkitError as e:
        return {"status": "refused", "reason": str(e).strip().splitlines()[0]}
    except Exception as e:  # noqa: BLE001 - any other exception is a bug to list
        return {"status": "crashed", "reason": f"{type(e).__name__}: {str(e).splitlines()[0]}"}
    return {"status": "exact", **row}
