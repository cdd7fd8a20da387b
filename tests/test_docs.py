"""The documentation site: every public name documented, every Python example runs, and the
strict MkDocs build (broken links and anchors, pages missing from the nav) passes."""

from __future__ import annotations

import ast
import importlib
import inspect
import os
import re
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
from references import import_reference

import vitkit
import vitkit.analysis

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
API_PAGES = sorted((DOCS / "api").glob("*.md"))
EXAMPLE_PAGES = [*API_PAGES, *sorted((DOCS / "guide").glob("*.md")), DOCS / "index.md"]
# An example that trains (seconds, not milliseconds) runs only with the slow tests.
SLOW_EXAMPLES = {("train.md", 0)}


def _documented() -> set[str]:
    """Every object named in a ``::: identifier`` line of the API pages."""
    names: set[str] = set()
    for page in API_PAGES:
        names |= set(re.findall(r"^::: ([\w.]+)", page.read_text(), re.M))
    return names


def _has_docstring(module: object, name: str) -> bool:
    obj = getattr(module, name)
    if inspect.isclass(obj) or inspect.isroutine(obj):
        return bool(inspect.getdoc(obj))
    # A constant: the string literal right after its assignment, as mkdocstrings reads it.
    source = importlib.import_module(vitkit._EXPORTS[name]) if module is vitkit else module
    tree = ast.parse(inspect.getsource(source))  # type: ignore[arg-type]
    body = tree.body
    for stmt, following in zip(body, body[1:]):
        targets = stmt.targets if isinstance(stmt, ast.Assign) else [getattr(stmt, "target", None)]
        if any(isinstance(t, ast.Name) and t.id == name for t in targets):
            return isinstance(following, ast.Expr) and isinstance(following.value, ast.Constant)
    return False


@pytest.mark.parametrize("module", [vitkit, vitkit.analysis], ids=lambda m: m.__name__)
def test_public_names_are_documented(module: object) -> None:
    documented = _documented()
    prefix = module.__name__  # type: ignore[attr-defined]
    missing = [n for n in module.__all__ if f"{prefix}.{n}" not in documented]  # type: ignore[attr-defined]
    assert not missing, f"docs/api: no '::: {prefix}.NAME' for {missing}"
    bare = [n for n in module.__all__ if not _has_docstring(module, n)]  # type: ignore[attr-defined]
    assert not bare, f"{prefix}: no docstring for {bare}"


def test_assumption_warning_is_public() -> None:
    from vitkit.errors import AssumptionWarning

    assert vitkit.AssumptionWarning is AssumptionWarning
    assert "AssumptionWarning" in vitkit.__all__


def _examples() -> list[tuple[str, int, str]]:
    found = []
    for page in EXAMPLE_PAGES:
        blocks = re.findall(r"^```python\n(.*?)^```", page.read_text(), re.S | re.M)
        found += [(page.name, i, code) for i, code in enumerate(blocks)]
    return found


def _marks(page: str, index: int, code: str) -> list[pytest.MarkDecorator]:
    """slow where listed; an example that may load OpenVINO (``fast=True`` picks it where it
    is installed) runs in a pytest process of its own (tests/conftest.py)."""
    marks = [pytest.mark.slow] if (page, index) in SLOW_EXAMPLES else []
    if "fast=True" in code or "openvino" in code:
        marks.append(pytest.mark.openvino)
    return marks


@pytest.mark.parametrize(
    "page,index,code",
    [pytest.param(*ex, marks=_marks(*ex)) for ex in _examples()],
    ids=lambda v: str(v) if not isinstance(v, str) or "\n" not in v else "",
)
def test_python_example_runs(
    page: str, index: int, code: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if "export_int8" in code or "fp32_engine_model" in code:
        pytest.importorskip("onnxruntime")
    if 'data="digits"' in code:
        pytest.importorskip("sklearn")
    for reference in ("timm", "transformers"):  # (switching.md runs against them)
        if re.search(rf"^import {reference}$", code, re.M):
            import_reference(reference)
    monkeypatch.chdir(tmp_path)
    with warnings.catch_warnings():
        exec(compile(code, f"docs/.../{page} (example {index})", "exec"), {})


def test_strict_build(tmp_path: Path) -> None:
    """The site builds with no warning: every link and anchor resolves, every page is in the
    nav, every ``:::`` name exists. Also what ``make test`` runs last."""
    mkdocs = shutil.which("mkdocs", path=str(Path(sys.executable).parent)) or shutil.which("mkdocs")
    if mkdocs is None:
        pytest.skip("mkdocs is not installed (pip install -c constraints.txt '.[docs]')")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "src"), env.get("PYTHONPATH")]))
    done = subprocess.run(
        [mkdocs, "build", "--strict", "--quiet", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    cli = (tmp_path / "site" / "cli" / "index.html").read_text()
    for command in ("vitkit train", "vitkit study data-scale", "vitkit export"):
        assert command in cli
    assert (tmp_path / "site" / "benchmarks" / "results" / "speed" / "index.html").is_file()


def test_the_cli_page_prints_percent_as_help_does() -> None:
    """argparse's "%%" escape appeared as "%%" in the CLI page's command table; ``--help``
    prints "%"."""
    spec = importlib.util.spec_from_file_location(
        "vitkit_docs_hook", Path(__file__).parents[1] / "docs" / "hooks" / "vitkit_docs.py"
    )
    assert spec and spec.loader
    hook = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hook)
    page = hook.cli_markdown()
    assert "1/10/100 % labels" in page and "%%" not in page


def test_every_results_file_the_experiments_page_names_exists() -> None:
    """docs/experiments.md names each figure's results file; a name with an extension
    (``bench/results/x.md``, a link to ``benchmarks/results/x.json``) is a file that exists."""
    root = Path(__file__).parents[1]
    page = (root / "docs" / "experiments.md").read_text()
    named = re.findall(r"(?:bench|benchmarks)/results/([\w./-]+?\.(?:md|json|png|txt))\b", page)
    assert len(named) > 20
    missing = sorted({n for n in named if not (root / "bench" / "results" / n).exists()})
    assert not missing, missing


def test_the_experiments_page_is_a_results_page_not_a_journal() -> None:
    """docs/experiments.md states each finding once with its results file: at most 500 lines,
    and no figure sourced from an old commit (a file that no longer exists) or left as a plan."""
    page = (Path(__file__).parents[1] / "docs" / "experiments.md").read_text()
    assert len(page.splitlines()) <= 500
    for stale in ("at commit", "Next (", "not adopted", "Not measured yet", "until 20"):
        assert stale not in page, stale
