"""MkDocs hooks of vitkit's documentation site: the pages made at build time, nothing committed.

- ``cli.md``: the command-line reference, from ``vitkit.cli.build_parser()``: every command and
  subcommand (``vitkit study STUDY``) with its description and its ``--help`` text.
- ``benchmarks/index.md``: ``bench/README.md`` (the maintained benchmarks);
  ``benchmarks/results/...``: every file under ``bench/results/`` (Markdown as pages, the JSON
  and text files beside them as downloads). The nav's ``Benchmarks`` entry is expanded into
  the index and every result page.
- A docs page links to repository files, so that its links also work where the Markdown is read
  on a forge: ``../bench/results/X`` (-> ``benchmarks/results/X``), ``../bench/README.md`` or a
  results folder (-> ``benchmarks/index.md``) and ``../src/vitkit/cli/`` (-> ``cli.md``, the
  command-line reference built from that package) are pointed at the site's pages.
- Docstrings written with reST roles (``:func:`load```) render as code linked to the API page
  that documents the name, where one does.

The hooks import the ``vitkit`` of this checkout (``src/``), so the reference always describes
the code next to it.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path
from typing import Any

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files
from mkdocs.structure.pages import Page

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench"
RESULTS = BENCH / "results"
CLI_PAGE = "cli.md"
BENCH_DIR = "benchmarks"
HELP_WIDTH = "96"  # columns of the --help text on the CLI page (argparse reads $COLUMNS)


# ---------------------------------------------------------------------------------------------
# the CLI reference


def _subcommands(parser: argparse.ArgumentParser) -> list[tuple[str, argparse.ArgumentParser]]:
    """``parser``'s subcommands in the order ``--help`` lists them."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return list(action.choices.items())
    return []


def _summaries(parser: argparse.ArgumentParser) -> dict[str, str]:
    """Each subcommand's one-line help, as the parent's ``--help`` lists it."""
    found: dict[str, str] = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for choice in action._choices_actions:
                found[choice.dest] = " ".join((choice.help or "").split())
    for _, sub in _subcommands(parser):
        found.update(_summaries(sub))
    return found


def _walk(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> list[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    found = [(path, parser)]
    for name, sub in _subcommands(parser):
        found += _walk(sub, (*path, name))
    return found


def _anchor(path: tuple[str, ...]) -> str:
    return "-".join(("vitkit", *path))


def cli_markdown() -> str:
    """The CLI reference page: a table of the commands, then each command's ``--help``."""
    if str(ROOT / "src") not in sys.path:
        sys.path.insert(0, str(ROOT / "src"))
    from vitkit.cli import build_parser

    saved = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = HELP_WIDTH
    try:
        parser = build_parser()
        commands = _walk(parser)
        helps = {path: sub.format_help() for path, sub in commands}
        summaries = _summaries(parser)
    finally:
        if saved is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = saved
    lines = [
        "# Command line",
        "",
        "Every command of `vitkit`, with the text its `--help` prints (this page is generated "
        "from the argument parser when the site is built, so it matches the code). A command "
        "that fails on bad input prints one line, `vitkit: error: ...`, and exits with code 2; "
        "a warning is one line, `vitkit: warning: ...`.",
        "",
        "| command | what it does |",
        "| --- | --- |",
    ]
    for path, sub in commands[1:]:
        summary = summaries.get(path[-1]) or " ".join((sub.description or "").split())
        summary = summary.replace("%%", "%")  # argparse's escape, as --help prints it
        lines.append(f"| [`vitkit {' '.join(path)}`](#{_anchor(path)}) | {summary} |")
    for path, sub in commands:
        title = " ".join(("vitkit", *path))
        level = "##" if len(path) <= 1 else "###"
        lines += ["", f"{level} `{title}` {{ #{_anchor(path) if path else 'vitkit'} }}", ""]
        if path and sub.description:
            lines += [" ".join(sub.description.split()).replace("%%", "%"), ""]
        lines += ["```text", helps[path].rstrip(), "```"]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------
# the benchmarks

MINIMAL_BENCH_INDEX = "# Benchmarks\n\nThe maintained benchmarks' results:\n"


def bench_files() -> dict[str, Path]:
    """Site path -> source file of every benchmark page and result file."""
    found: dict[str, Path] = {}
    if (BENCH / "README.md").is_file():
        found[f"{BENCH_DIR}/index.md"] = BENCH / "README.md"
    if RESULTS.is_dir():
        for path in sorted(RESULTS.rglob("*")):
            if path.is_file() and path.suffix in (".md", ".json", ".txt", ".png", ".csv"):
                rel = path.relative_to(RESULTS).as_posix()
                found[f"{BENCH_DIR}/results/{rel}"] = path
    return found


def _bench_nav(pages: list[str]) -> list[Any]:
    """The Benchmarks nav section: the index, then the results grouped by folder."""
    nav: list[Any] = [{"Overview": f"{BENCH_DIR}/index.md"}]
    top: list[Any] = []
    folders: dict[str, list[Any]] = {}
    for page in pages:
        if not page.startswith(f"{BENCH_DIR}/results/"):
            continue
        rel = page.removeprefix(f"{BENCH_DIR}/results/")
        entry = {rel.removesuffix(".md"): page}
        if "/" in rel:
            folders.setdefault(rel.split("/", 1)[0], []).append(entry)
        else:
            top.append(entry)
    nav.append({"Results": top + [{name: entries} for name, entries in folders.items()]})
    return nav


_LINK = re.compile(r"(!?)\[([^\]]*)\]\((?!https?:|#|mailto:)([^)\s]+)\)")


def _bench_link(target: str, page: str) -> str:
    """A link of a bench/ Markdown file, as the site's pages lie: ``../docs/X.md`` -> ``X.md``
    relative to the page; a link to a script in bench/ -> "" (the text stays, unlinked)."""
    depth = page.count("/")  # benchmarks/index.md: 1; benchmarks/results/x.md: 2
    rel = page.removeprefix(f"{BENCH_DIR}/results/")
    if page == f"{BENCH_DIR}/index.md":
        source_dir = "bench"
    else:
        source_dir = "/".join(("bench/results", *rel.split("/")[:-1]))
    file, _, fragment = target.partition("#")
    resolved = os.path.normpath(os.path.join(source_dir, file))
    up = "../" * depth
    if resolved.startswith("docs/"):
        new = up + resolved.removeprefix("docs/")
    elif resolved.startswith("bench/results/") and (ROOT / resolved).is_file():
        new = up + BENCH_DIR + "/results/" + resolved.removeprefix("bench/results/")
    elif resolved == "bench/README.md":
        new = up + BENCH_DIR + "/index.md"
    else:
        return ""
    return new + (f"#{fragment}" if fragment else "")


CLI_SOURCE = "src/vitkit/cli"  # what a docs page links to for the command-line reference


def _docs_link(target: str, page: str) -> str | None:
    """A docs page's link to a repository file outside docs/, as the site holds it (None: a
    link left as written)."""
    file, _, fragment = target.partition("#")
    if not file:
        return None
    page_dir = os.path.dirname(page)
    resolved = os.path.normpath(os.path.join("docs", page_dir, file))
    if resolved.startswith("docs/"):
        return None
    if resolved.startswith("bench/results/") and (ROOT / resolved).is_file():
        site = f"{BENCH_DIR}/results/" + resolved.removeprefix("bench/results/")
    elif resolved in ("bench", "bench/README.md", "bench/results") or (
        resolved.startswith("bench/results/") and (ROOT / resolved).is_dir()
    ):
        site = f"{BENCH_DIR}/index.md"
    elif resolved == CLI_SOURCE:
        site = CLI_PAGE
    else:
        return None
    new = os.path.relpath(site, page_dir or ".")
    return new + (f"#{fragment}" if fragment else "")


def rewrite_docs_links(markdown: str, page: str) -> str:
    """A docs page's links to repository files outside docs/ pointed at the site's pages."""

    def fix(match: re.Match[str]) -> str:
        bang, text, target = match.groups()
        new = _docs_link(target, page)
        return match.group(0) if new is None else f"{bang}[{text}]({new})"

    return _LINK.sub(fix, markdown)


def rewrite_bench_links(markdown: str, page: str) -> str:
    """The links of a bench/ page pointed at where the site holds their targets."""

    def fix(match: re.Match[str]) -> str:
        bang, text, target = match.groups()
        new = _bench_link(target, page)
        return f"{bang}[{text}]({new})" if new else text

    return _LINK.sub(fix, markdown)


# ---------------------------------------------------------------------------------------------
# reST roles in docstrings

_ROLE = re.compile(
    r":(?:py:)?(?:func|class|meth|mod|attr|data|exc|obj):<code>(~?)([\w.]+)(\(\))?</code>"
)


def documented_names(docs_dir: Path) -> dict[str, str]:
    """Short name -> the identifier an API page documents it under (``pooled_row`` ->
    ``vitkit.analysis.pooled_row``), for the names that are documented once."""
    found: dict[str, set[str]] = {}
    for page in sorted((docs_dir / "api").glob("*.md")):
        for ident in re.findall(r"^::: ([\w.]+)", page.read_text(encoding="utf-8"), re.M):
            found.setdefault(ident.rsplit(".", 1)[-1], set()).add(ident)
    return {short: next(iter(idents)) for short, idents in found.items() if len(idents) == 1}


def render_roles(html: str, names: dict[str, str] | None = None) -> str:
    """``:func:<code>x</code>`` (a reST role rendered as Markdown) -> ``x`` as code, linked to
    the API page that documents it where one does (an unqualified name through ``names``)."""

    def role(match: re.Match[str]) -> str:
        short, name, call = match.groups()
        shown = name.rsplit(".", 1)[-1] if short else name
        ident = name if "." in name else (names or {}).get(name, name)
        return f'<autoref optional identifier="{ident}"><code>{shown}{call or ""}</code></autoref>'

    return _ROLE.sub(role, html)


# ---------------------------------------------------------------------------------------------
# the hooks

_NAMES: dict[str, str] = {}  # short name -> documented identifier, filled on the first page


def on_config(config: MkDocsConfig) -> MkDocsConfig:
    _NAMES.clear()  # read again from the API pages on each build (mkdocs serve)
    pages = [p for p in bench_files() if p.endswith(".md")]
    if f"{BENCH_DIR}/index.md" not in pages:
        pages.insert(0, f"{BENCH_DIR}/index.md")
    nav = config.nav or []
    for i, item in enumerate(nav):
        if isinstance(item, dict) and "Benchmarks" in item:
            nav[i] = {"Benchmarks": _bench_nav(pages)}
    return config


def on_files(files: Files, config: MkDocsConfig) -> Files:
    files.append(File.generated(config, CLI_PAGE, content=cli_markdown()))
    found = bench_files()
    if f"{BENCH_DIR}/index.md" not in found:
        listing = [MINIMAL_BENCH_INDEX] + [
            f"- [{p.removeprefix(f'{BENCH_DIR}/results/')}]({p.removeprefix(f'{BENCH_DIR}/')})"
            for p in found
            if p.endswith(".md")
        ]
        files.append(File.generated(config, f"{BENCH_DIR}/index.md", content="\n".join(listing)))
    for site_path, source in found.items():
        files.append(File.generated(config, site_path, abs_src_path=str(source)))
    return files


def on_page_markdown(markdown: str, page: Page, config: MkDocsConfig, files: Files) -> str:
    if page.file.src_uri.startswith(f"{BENCH_DIR}/"):
        return rewrite_bench_links(markdown, page.file.src_uri)
    return rewrite_docs_links(markdown, page.file.src_uri)


def on_page_content(html: str, page: Page, config: MkDocsConfig, files: Files) -> str:
    if not _NAMES:
        _NAMES.update(documented_names(Path(config.docs_dir)))
    return render_roles(html, _NAMES)
