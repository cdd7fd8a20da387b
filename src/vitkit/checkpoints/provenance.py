"""Where each field of a loaded model's config came from, and the one line said for a guess.

Every reader (vitkit, npz, timm, Hugging Face) returns, beside the config, one
:class:`Provenance`: for each config field one of :data:`SOURCES`, a few words on why where it
helps, and the :class:`Assumption` s it made. An assumption is a value that neither the file's
config, nor the weights, nor a named architecture's table fixes, and that changes the numbers
(an epsilon, the GELU, the heads, the block order, the pooling): it is said aloud when the
checkpoint is read, as one :class:`vitkit.errors.AssumptionWarning`: a summary line naming the
fields and how to state them, then one short indented line per field with the value assumed, why
and its override (:meth:`Provenance.to_dict` keeps each field's full line, with what else it could
be). A value the caller gives
(``vitkit.load(path, gelu="quick")``, ``-o gelu=quick``) is ``"given"`` and silences it.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from vitkit.errors import AssumptionWarning

SOURCES: dict[str, str] = {
    "file": "the file's own config",
    "weights": "implied by the weights (shapes, key names)",
    "name": "the named architecture's table",
    "format": "fixed by the format (its writer has one value)",
    "given": "given when loading",
    "assumed": "assumed by vitkit (said when loaded)",
    "default": "vitkit's default: a training setting with no effect on a loaded model's outputs",
}


# Sources a vitkit checkpoint written by a conversion keeps in its meta ("provenance"), so that
# reading it back says "given" / "assumed" for those fields, not "the file's own config".
TRAVELS = ("given", "assumed")


def carried(meta: Mapping[str, Any]) -> dict[str, list[str]]:
    """The fields a converted checkpoint's ``meta["provenance"]`` keeps, by source."""
    stored = meta.get("provenance")
    out: dict[str, list[str]] = {}
    if isinstance(stored, Mapping):
        for f, s in stored.items():
            if s in TRAVELS and isinstance(f, str):
                out.setdefault(str(s), []).append(f)
    return out


@dataclass(frozen=True)
class Assumption:
    """A setting vitkit assumed: ``value`` (``why``), what else it could be, and a value to
    show in the override hint."""

    field: str
    value: Any
    why: str
    otherwise: str
    example: Any

    def line(self, source: str, short: bool = False) -> str:
        said = f"{source}: {self.field}={self.value!r} assumed ({self.why})"
        if self.example is None or not short:  # (short: the override in place of the rest)
            said += f"; {self.otherwise}"
        if self.example is None:  # an alternative vitkit cannot compute
            return said
        # ``example``: one value of ``field``, or {field: value} where a hint needs several
        example = self.example if isinstance(self.example, dict) else {self.field: self.example}
        hint = ", ".join(f"{k}={v!r}" for k, v in example.items())
        cli = " ".join(f"-o {k}={_cli(v)}" for k, v in example.items())
        return f"{said}: load with {hint} ({cli} on the command line)"


def _cli(value: Any) -> str:
    return ",".join(str(v) for v in value) if isinstance(value, (tuple, list)) else str(value)


# What a file without its preprocessing gets, said once (mean and std change every input).
IMAGENET = {"mean": (0.485, 0.456, 0.406), "std": (0.229, 0.224, 0.225)}
PAPER_PREPROCESS = Assumption(
    "mean",
    (0.5, 0.5, 0.5),
    "the paper's preprocessing: pixels to [-1, 1] with std 0.5, bilinear resize; the file "
    "does not say its own",
    "timm's ImageNet models (DeiT, DINOv2, ...) normalise with ImageNet's mean and std, "
    "CLIP towers with OpenAI's (0.481, 0.458, 0.408) / (0.269, 0.261, 0.276)",
    IMAGENET,
)


@dataclass
class Provenance:
    """``sources[field]`` is a key of :data:`SOURCES`; ``notes[field]`` says why, briefly."""

    sources: dict[str, str] = field(default_factory=dict)
    notes: dict[str, str] = field(default_factory=dict)
    assumptions: list[Assumption] = field(default_factory=list)

    def set(self, source: str, fields: Iterable[str], note: str = "") -> Provenance:
        for f in fields:
            self.sources[f] = source
            if note:
                self.notes[f] = note
            else:
                self.notes.pop(f, None)
        return self

    def assume(self, a: Assumption) -> Provenance:
        self.set("assumed", [a.field], a.why)
        self.assumptions = [x for x in self.assumptions if x.field != a.field] + [a]
        return self

    def complete(self, all_fields: Iterable[str], default: str) -> Provenance:
        """Every field of the config gets a source (``default`` where none was set)."""
        for f in all_fields:
            self.sources.setdefault(f, default)
        return self

    def give(self, given: Mapping[str, Any]) -> Provenance:
        """Fields the caller stated: ``given``, their assumptions dropped."""
        self.set("given", given)
        self.assumptions = [a for a in self.assumptions if a.field not in given]
        return self

    def warn(self, source: str, stacklevel: int = 3) -> None:
        """One warning for every assumption: a summary line, then one indented line a field."""
        if not self.assumptions:
            return
        n, names = len(self.assumptions), ", ".join(a.field for a in self.assumptions)
        them = "them" if n > 1 else "it"
        head = (
            f"{source}: {n} setting{'s' if n > 1 else ''} assumed (the file does not say "
            f"{them}): {names}; state {them} with --arch NAME or -o KEY=VALUE"
        )
        body = "".join(f"\n  {a.line('', short=True).lstrip(': ')}" for a in self.assumptions)
        warnings.warn(AssumptionWarning(head + body), stacklevel=stacklevel)

    def by_source(self) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for f, s in self.sources.items():
            out.setdefault(s, []).append(f)
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "sources": dict(self.sources),
            "notes": dict(self.notes),
            "assumed": {a.field: a.line("").lstrip(": ") for a in self.assumptions},
        }
