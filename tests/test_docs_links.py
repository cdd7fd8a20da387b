"""Links and results files that work where people read them: every relative link of README,
docs/ and bench/ names a file (or folder) of the repository, so it works on a forge as well as
in the built site (docs/hooks points the links at the site's pages); every results markdown
names the command that wrote it and the machine, or says that its CPU was not recorded."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
CODE = re.compile(r"^```.*?^```|`[^`\n]*`", re.S | re.M)
# a command as run: python bench/X.py, bench/X.sh, vitkit ..., pytest ..., with its environment
COMMAND = re.compile(
    r"(?:`|^    )(?:\w+=\S+ )*(?:python3? |\.venv/bin/)?"
    r"(?:bench/[\w/]+\.(?:py|sh)\b|vitkit \w|pytest |torchrun )",
    re.M,
)
# the machine: a CPU or GPU by name, or the plain statement that it was not recorded
MACHINE = re.compile(r"AMD EPYC|Intel|Xeon|NVIDIA|CPU (?:was )?not recorded")


def markdown_files() -> list[Path]:
    pages = [ROOT / "README.md", ROOT / "bench" / "README.md"]
    pages += sorted(p for p in (ROOT / "docs").rglob("*.md") if "hooks" not in p.parts)
    return pages + sorted((ROOT / "bench" / "results").rglob("*.md"))


def broken_links(page: Path) -> list[str]:
    """The relative links of ``page`` (outside code) that name no file or folder of the
    repository."""
    text = CODE.sub("", page.read_text())
    out = []
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue
        path = (page.parent / target.split("#")[0]).resolve()
        if not path.exists() or not path.is_relative_to(ROOT):
            out.append(f"{page.relative_to(ROOT)}: {target}")
    return out


def test_every_relative_link_names_a_repository_file() -> None:
    """Links to the pages the site generates (``benchmarks/results/x.md``, ``cli.md``) were
    dead on a forge; a docs page links to ``../bench/results/x.md`` and ``../src/vitkit/cli/``
    instead, which the site's hook points at its own pages."""
    pages = markdown_files()
    assert len(pages) > 60
    broken = [b for page in pages for b in broken_links(page)]
    assert not broken, "\n".join(broken[:40])


def test_the_link_check_flags_a_page_only_the_site_has(tmp_path: Path) -> None:
    docs = ROOT / "docs" / "guide"
    page = docs / "_link_probe.md"
    page.write_text(
        "[a](../../bench/results/speed.md) [b](../benchmarks/results/speed.md) [c](../cli.md)\n"
        "[d](../../src/vitkit/cli/#vitkit-train) `[e](nowhere.md)` [f](https://example.org)\n"
    )
    try:
        found = broken_links(page)
    finally:
        page.unlink()
    assert found == [
        "docs/guide/_link_probe.md: ../benchmarks/results/speed.md",
        "docs/guide/_link_probe.md: ../cli.md",
    ]


def test_the_site_points_repository_links_at_its_pages() -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "vitkit_docs_hook", ROOT / "docs" / "hooks" / "vitkit_docs.py"
    )
    assert spec and spec.loader
    hook = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hook)
    page = (
        "[s](../../bench/results/speed.md#x) [p](../../bench/results/paper/) "
        "[i](../../bench/README.md) [c](../../src/vitkit/cli/#vitkit-train) [t](training.md)"
    )
    assert hook.rewrite_docs_links(page, "guide/inference.md") == (
        "[s](../benchmarks/results/speed.md#x) [p](../benchmarks/index.md) "
        "[i](../benchmarks/index.md) [c](../cli.md#vitkit-train) [t](training.md)"
    )


def test_no_code_in_a_table_escapes_a_pipe() -> None:
    """``\\|`` inside code in a table cell: a forge shows ``|``, the site ``\\|``."""
    found = [
        f"{p.relative_to(ROOT)}: {m}"
        for p in markdown_files()
        for m in re.findall(r"`[^`\n]*\\\|[^`\n]*`", p.read_text())
    ]
    assert not found, found


def unnamed(results: Path) -> list[str]:
    """The results markdown files under ``results`` that name no command or no machine."""
    out = []
    for f in sorted(results.rglob("*.md")):
        text = f.read_text()
        if not COMMAND.search(text):
            out.append(f"{f.relative_to(results)}: no command")
        if not MACHINE.search(text):
            out.append(f"{f.relative_to(results)}: no machine")
    return out


def test_every_results_markdown_names_its_command_and_machine() -> None:
    assert len(list((ROOT / "bench" / "results").rglob("*.md"))) > 40
    assert unnamed(ROOT / "bench" / "results") == []


def test_the_results_check_flags_a_file_without_command_or_machine(tmp_path: Path) -> None:
    (tmp_path / "a.md").write_text("torch 2.13.0+cpu, 2 threads, cpu\n\n| x |\n")
    (tmp_path / "b.md").write_text("Command: `python bench/speed.py --models S/16`\n")
    (tmp_path / "c.md").write_text("AMD EPYC (2 vCPUs)\n\n    vitkit train --recipe mnist\n")
    (tmp_path / "d.md").write_text("Command: `bench/paper_cpu.sh compute`\n\nCPU not recorded.\n")
    (tmp_path / "e.md").write_text("NVIDIA H200\n\nthe default job (`vitkit train`)\n")
    assert unnamed(tmp_path) == ["a.md: no command", "a.md: no machine", "b.md: no machine"]
