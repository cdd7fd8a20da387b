"""bench/README.md is the index of the maintained benchmarks and stays in step with bench/: every
script has its row, every link of the index exists, every row names the docs page that cites
it, and every results file is listed (a link to a folder lists what it holds)."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LINK = re.compile(r"\]\(([^)#\s]+)\)")


def problems(bench: Path, docs_root: Path) -> list[str]:
    """What is out of step between ``bench/README.md`` and ``bench/`` (empty: nothing)."""
    text = (bench / "README.md").read_text()
    rows = [x for x in text.splitlines() if x.startswith("| [")]
    named = [re.match(r"\| \[([^\]]+)\]", row).group(1) for row in rows]  # type: ignore[union-attr]
    scripts = {p.name for p in bench.iterdir() if p.suffix in (".py", ".sh")}
    out = [f"script without a row: {s}" for s in sorted(scripts - set(named))]
    out += [f"row for a script that does not exist: {s}" for s in sorted(set(named) - scripts)]
    out += [f"two rows for {s}" for s in sorted({s for s in named if named.count(s) > 1})]
    links = LINK.findall(text)
    out += [f"link to nothing: {x}" for x in links if not (bench / x).exists()]
    for row, script in zip(rows, named, strict=True):
        pages = re.findall(r"docs/[\w/.-]+\.md", row.rstrip(" |").rsplit("|", 1)[1])
        if not pages or not all((docs_root / p).is_file() for p in pages):
            out.append(f"row {script}: no docs page that exists in its last column")
    listed = [(bench / x).resolve() for x in links if x.startswith("results/")]
    for p in sorted((bench / "results").rglob("*")):
        if p.is_file() and not any(p.resolve() == x or x in p.resolve().parents for x in listed):
            out.append(f"results file not listed: {p.relative_to(bench)}")
    return out


def test_the_index_and_bench_agree() -> None:
    assert len(LINK.findall((ROOT / "bench" / "README.md").read_text())) > 20
    assert problems(ROOT / "bench", ROOT) == []


def test_the_check_catches_each_kind_of_drift(tmp_path: Path) -> None:
    bench = tmp_path / "bench"
    shutil.copytree(ROOT / "bench", bench, ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / "docs").symlink_to(ROOT / "docs")
    assert problems(bench, tmp_path) == []
    (bench / "new_probe.py").write_text("")
    (bench / "results" / "new_probe.md").write_text("")
    (bench / "results" / "threads.json").unlink()
    index = bench / "README.md"
    index.write_text(index.read_text().replace("docs/paper.md |", "docs/nowhere.md |"))
    assert problems(bench, tmp_path) == [
        "script without a row: new_probe.py",
        "link to nothing: results/threads.json",
        "row paper_cpu.sh: no docs page that exists in its last column",
        "row precision.py: no docs page that exists in its last column",
        "results file not listed: results/new_probe.md",
    ]
