"""``KEY=VALUE`` settings as typed on a command line, turned into typed config overrides.

``-o depth=6 -o pool=gap`` (model fields), ``-p mask_ratio=0.6`` (objective settings) and the
brackets of a study's model list (``Ti/4[depth=4,width=96]``) all go through
:func:`parse_key_values`; the config dataclasses then check names and values.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from vitkit.errors import VitkitError


def parse_value(text: str) -> Any:
    """``6`` → 6, ``0.1`` → 0.1, ``true`` → True, ``none`` → None, ``32,48`` → [32, 48];
    brackets make a list of any length: ``[]`` → [] (the hybrid's root-only ResNet,
    ``resnet_layers=[]``), ``[3]`` → [3], ``[3,4]`` → [3, 4]."""
    if len(text) >= 2 and text[0] + text[-1] in ("[]", "()"):
        inner = text[1:-1].strip()
        return [parse_value(t.strip()) for t in inner.split(",")] if inner else []
    low = text.lower()
    if low in ("true", "false"):
        return low == "true"
    if low in ("none", "null"):
        return None
    if "," in text:
        return [parse_value(t) for t in text.split(",")]
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text


def parse_key_values(items: Sequence[str] | None) -> dict[str, Any]:
    """``["depth=6", "mlp-dim=512"]`` → ``{"depth": 6, "mlp_dim": 512}`` (dashes become
    underscores, values as :func:`parse_value` reads them)."""
    out = {}
    for item in items or ():
        key, sep, value = item.partition("=")
        if not sep:
            raise VitkitError(f"expected KEY=VALUE, got '{item}'")
        out[key.strip().replace("-", "_")] = parse_value(value.strip())
    return out
