"""The shape of the source tree holds: imports go one way, no module imports itself back in a
circle, and no file grows past the size a reader can hold (docs/design.md, "Layout")."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = SRC / "vitkit"
MAX_LINES = 600  # the hard line; aim for ~500

# Layers, lowest first: a module may import its own layer and those below, never above.
# (The library is everything that is neither training nor the command line.)
TRAIN = {"train", "studies"}
CLI = {"cli", "__main__"}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _layer(module: str) -> int:
    parts = module.split(".")
    top = parts[1] if len(parts) > 1 else ""
    if top in CLI:
        return 2
    if top in TRAIN:
        return 1
    return 0


MODULES = {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every vitkit import in the file, lazy ones inside functions too;
    ``from vitkit.a import b`` names ``vitkit.a.b`` when that is a module."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.startswith("vitkit")]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if not node.module.startswith("vitkit"):
                continue
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                found.append((node.lineno, sub if sub in MODULES else node.module))
    return found


def test_imports_go_one_way() -> None:
    """model, config, checkpoints, data, eval, analysis, plotting, ... never import train or
    cli; train never imports cli."""
    bad = []
    for name, path in MODULES.items():
        for line, target in _imports(path):
            if target.startswith("vitkit.") and _layer(target) > _layer(name):
                bad.append(f"{path.relative_to(SRC)}:{line} imports {target}")
    assert not bad, "upward imports:\n" + "\n".join(bad)


def test_no_import_cycles_between_modules() -> None:
    """No module imports another that imports it back (directly or around a circle), lazy
    imports included; imports of a package's ``__init__`` (its re-exports) are not followed."""
    graph = {
        name: {t for _, t in _imports(path) if t in MODULES and t != name}
        for name, path in MODULES.items()
        if path.name != "__init__.py"
    }
    graph = {n: {t for t in ts if t in graph} for n, ts in graph.items()}
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    stack: list[str] = []
    cycles = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycles.append(" -> ".join([*stack[stack.index(nxt) :], nxt]))
            elif nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def test_no_export_shadows_a_submodule() -> None:
    """A package that re-exports a name equal to one of its submodules (``describe`` beside
    ``describe.py``) hands out the module instead of the function once anything imports the
    submodule: ``from vitkit.checkpoints import describe`` then returns a module."""
    bad = []
    for name, path in MODULES.items():
        if path.name != "__init__.py":
            continue
        for node in ast.parse(path.read_text(), str(path)).body:
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                for alias in node.names:
                    bound = alias.asname or alias.name
                    sub = f"{name}.{bound}"
                    # (from the submodule itself is safe: it is loaded before the name is bound)
                    if sub in MODULES and node.module not in (sub, name):
                        bad.append(f"{path.relative_to(SRC)}: '{bound}' is also {sub}")
    assert not bad, "exports shadowed by submodules:\n" + "\n".join(bad)


@pytest.mark.parametrize("name", sorted(MODULES))
def test_source_file_size(name: str) -> None:
    path = MODULES[name]
    lines = len(path.read_text().splitlines())
    assert lines <= MAX_LINES, (
        f"{path.relative_to(SRC)} has {lines} lines (more than {MAX_LINES}): split it by concern"
    )


def test_the_rules_can_fail(tmp_path: Path) -> None:
    """The checks see what they must: an upward import and a long file are found."""
    bad = tmp_path / "vitkit" / "model.py"
    bad.parent.mkdir()
    bad.write_text("def f():\n    from vitkit.train.trainer import Trainer\n")
    rel = bad.relative_to(tmp_path)
    assert _layer("vitkit.train.trainer") > _layer(_module_name(SRC / rel))
    assert [t for _, t in _imports(bad)] == ["vitkit.train.trainer"]


def _repeated_basenames(paths: list[Path]) -> dict[str, list[str]]:
    seen: dict[str, list[str]] = {}
    for p in paths:
        if p.name not in ("__init__.py", "__main__.py"):
            seen.setdefault(p.name, []).append(str(p.relative_to(SRC)))
    return {name: where for name, where in seen.items() if len(where) > 1}


def test_every_module_basename_is_unique() -> None:
    """A name in a traceback or a grep points at one file (docs/design.md, "Layout")."""
    repeated = _repeated_basenames(list(MODULES.values()))
    assert not repeated, f"basenames used twice: {repeated}"
    # and the check sees a repeat
    fake = [PACKAGE / "train" / "config.py", PACKAGE / "selfsup" / "config.py"]
    assert _repeated_basenames(fake) == {"config.py": [str(p.relative_to(SRC)) for p in fake]}


def test_the_package_root_holds_packages_not_modules() -> None:
    """The root keeps the public face and a few utilities; everything else is in a package."""
    top = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(top) <= 8, f"{len(top)} modules at the package root: {top}"


def test_the_command_line_is_built_without_the_models_or_the_checkpoints():
    """``vitkit --help`` (every command's parser) imports neither vitkit.models nor
    vitkit.checkpoints: a .pt2 package is run without them (tests/test_export_pt2.py)."""
    import os
    import subprocess
    import sys

    code = (
        "import sys\nfrom vitkit.cli import main\n"
        "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
        "print(sorted(m for m in sys.modules if m.startswith(('vitkit.models', "
        "'vitkit.checkpoints'))))"
    )
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "[]", done.stdout[-2000:]
