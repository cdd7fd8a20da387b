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
    r"|AWS_SESSION_TOKEN"  # the AWS credential variable
    r"|\w+lease|please",  # release, released, please
    re.I,
)
SUFFIXES = {".md", ".py", ".sh", ".txt", ".json", ".toml", ".cfg", ".yml", ".yaml"}
# How a figure was judged or scheduled (a figure is stated with what it is compared with), and
# the absolute folders of the machine it was measured on (commands are recorded relative,
# `runs/...`): searched in docs/ and bench/, results included.
JUDGING = re.compile(
    r"\(bar\b|\bbar:|\bbar [0-9]|[Tt]arget met|\bTargets?:|\b[Nn]ot met\b|NOT met|\*\*met\*\*"
    r"|met / not met|minutes of device time|a call of its own|the card's image|\(carried\)"
    # a result's reference level and whether it was reached (results JSON included), a check
    # verdict line, and what has or has not run since
    r"|\bgoals?\b|\"met\"|reference levels?\b|^Checks: |\bcarried\b|\bTARGET_\w+"
    r"|not (?:been )?run on a card since",
    re.M,
)
# (an interpreter line, #!/usr/bin/env, is no machine's own path)
MACHINE_PATH = re.compile(r"(?<![\w.~/!-])/(tmp|work|root|home|Users|opt|usr|var|mnt|srv)/")


def hits(paths: list[Path], judged: bool = False) -> list[str]:
    """``file:line: text`` for every line of the text files under ``paths`` with a word that
    is not about the product (``judged``: or a judging word or a machine's absolute path)."""
    out = []
    for top in paths:
        files = [top] if top.is_file() else sorted(p for p in top.rglob("*") if p.is_file())
        for f in files:
            if f.suffix not in SUFFIXES or "__pycache__" in f.parts:
                continue
            for n, line in enumerate(f.read_text(errors="replace").splitlines(), 1):
                bad = WORDS.search(line) and WORDS.search(ALLOWED.sub("", line))
                if bad or judged and (JUDGING.search(line) or MACHINE_PATH.search(line)):
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


@pytest.mark.parametrize("where", ["README.md", "docs", "bench"])
def test_no_judging_words_or_machine_paths(where: str) -> None:
    """docs/, the README and everything under bench/: the results (Markdown, JSON, text logs)
    and the scripts that write them (gpu_report.py, mnist_best.py, ...)."""
    found = hits([ROOT / where], judged=True)
    assert not found, "\n".join(found[:40])


def test_the_check_flags_judging_words_and_machine_paths(tmp_path: Path) -> None:
    bad = [
        "**7.39x** timm fp32 (bar: 6x and 1.2x)",
        "Targets: mean_test_top1>=0.9965: NOT met",
        "| int8 dynamic | 85.21 % | not met |",
        "the test log; 15 minutes of device time, two calls",
        "it needs a call of its own",
        "torch 2.11.0 (the card's image), torchao 0.17.0 (carried)",
        "Command: `bench/int8_accuracy.py /work/runs34/int8/shapes-vit`",
        "written to /tmp/pytest-of-root/pytest-3/x",
        ' "goals": {',
        '   "met": false',
        "B/16 bf16 (compiled, batch 256) beside reference levels:",
        "Checks: mean_test_top1>=0.9965: no, every_seed<=0.8x_mnist_long: yes",
        "  lost the carried torchao: the run refused in its one line",
        "  has not run on a card since.",
        "popenargs = (['/opt/torch/.venv/bin/python3', '-m', 'vitkit'],)",
        "/usr/lib/python3.12/subprocess.py:571: CalledProcessError",
    ]
    good = [
        "Command: `bench/int8_accuracy.py runs/int8/shapes-vit --work runs/int8/work`",
        "the MPP target is the 3-bit mean colour; -p target=pixels",
        "a progress bar; 1.56x ONNX Runtime's dynamic int8",
        "see docs/guide/serving.md and src/vitkit/serve/app.py",
        "#!/usr/bin/env bash",
        "a metric of the serve page; the checks of config_checks.py",
    ]
    (tmp_path / "page.md").write_text("\n".join(bad + good) + "\n")
    found = hits([tmp_path], judged=True)
    assert [h.split(": ", 1)[1] for h in found] == bad


def test_every_results_file_is_searched() -> None:
    """The searches above read every text file under bench/results: a results file of a kind
    they skip (a .log, a .csv) would hide its lines."""
    kinds = {p.suffix for p in (ROOT / "bench" / "results").rglob("*") if p.is_file()}
    assert kinds - {".png"} <= SUFFIXES, kinds - {".png"} - SUFFIXES
