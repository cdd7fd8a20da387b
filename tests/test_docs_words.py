"""The documents, the code and the benchmarks describe the product, never how it was made: the
equivalent of ``grep -rniE "session|lease|issue [0-9]|the bar" README.md docs/ src/ bench/``
finds nothing but the allowed uses below (ONNX Runtime's sessions, "release", "please", ...)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
WORDS = re.compile(r"session|lease|issue [0-9]|the bar\b", re.I)  # ("the bare": fine)
# Uses about the product (or other tools' own words), removed before WORDS is searched again
ALLOWED = re.compile(
    r"InferenceSession|SessionOptions|add_session_config_entry|\"session\.intra_op"
    r"|\bsession\.(run|get_inputs)\(|\bsession = ort\.|ONNX Runtime session"
    r"|test session starts"  # pytest's own header in a saved log
    r"|\w+lease|please",  # release, released, please
    re.I,
)
SUFFIXES = {".md", ".py", ".sh", ".txt", ".json", ".toml", ".cfg", ".yml", ".yaml"}


def hits(paths: list[Path]) -> list[str]:
    """``file:line: text`` for every line of the text files under ``paths`` with a word that
    is not about the product."""
    out = []
    for top in paths:
        files = [top] if top.is_file() else sorted(p for p in top.rglob("*") if p.is_file())
        for f in files:
            if f.suffix not in SUFFIXES or "__pycache__" in f.parts:
                continue
            for n, line in enumerate(f.read_text(errors="replace").splitlines(), 1):
                if WORDS.search(line) and WORDS.search(ALLOWED.sub("", line)):
                    out.append(
                        f"{f.relative_to(ROOT) if f.is_relative_to(ROOT) else f}:{n}: {line}"
                    )
    return out


@pytest.mark.parametrize("where", ["README.md", "docs", "src", "bench"])
def test_no_words_about_how_it_was_made(where: str) -> None:
    found = hits([ROOT / where])
    assert not found, "\n".join(found[:40])


def test_the_check_flags_process_words_and_passes_the_products(tmp_path: Path) -> None:
    bad = [
        "Measured in a later session on another host.",
        "## Speed (issue 7)",
        "The second lease ran them.",
        "Against the bar: 6x.",
        "ISSUE 28's target",
    ]
    good = [
        "runs under an ONNX Runtime session (InferenceSession, SessionOptions)",
        '    so.add_session_config_entry("session.intra_op.allow_spinning", "0")',
        "        return session.run(None, {name: x})[0]",
        "torch 2.13.0 release build; please see the issue tracker",
        "============================= test session starts ==============================",
        "a progress bar redrawn in place",
        "the bare state dict alone",
    ]
    (tmp_path / "page.md").write_text("\n".join(bad + good) + "\n")
    found = hits([tmp_path])
    assert [h.split(": ", 1)[1] for h in found] == bad
