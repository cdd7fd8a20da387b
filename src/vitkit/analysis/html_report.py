"""A self-contained HTML report: one file, every figure embedded as a base64 PNG, no scripts,
no external styles or fonts, so it can be mailed, attached to an issue or opened offline.

A report is a title and a list of :class:`Section`\\ s; a section holds paragraphs, tables and
figures in order. All text is HTML-escaped.
"""

from __future__ import annotations

import base64
import datetime
import html
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from vitkit.checkpoints import atomic_write_text
from vitkit.errors import VitkitError


@dataclass
class Figure:
    """A PNG (read from ``path`` when the report is rendered) and its caption."""

    path: Path
    caption: str = ""


@dataclass
class Table:
    header: Sequence[str]  # all empty: no header row
    rows: Sequence[Sequence[object]]
    caption: str = ""


@dataclass
class Section:
    title: str
    items: list[str | Figure | Table] = field(default_factory=list)  # str: a paragraph


_STYLE = """
body { font-family: -apple-system, "Segoe UI", Helvetica, Arial, sans-serif; margin: 0;
       color: #1d1d1f; background: #fafafa; line-height: 1.45; }
main { max-width: 1100px; margin: 0 auto; padding: 24px 32px 48px; background: #fff; }
h1 { font-size: 1.6em; margin-bottom: 0.2em; }
h2 { font-size: 1.25em; margin-top: 1.8em; border-bottom: 1px solid #ddd; padding-bottom: 4px; }
.sub { color: #666; margin-top: 0; }
figure { margin: 16px 0; }
figure img { max-width: 100%; height: auto; border: 1px solid #eee; }
figcaption { color: #555; font-size: 0.9em; margin-top: 4px; }
table { border-collapse: collapse; margin: 12px 0; font-size: 0.92em; }
th, td { border: 1px solid #ddd; padding: 4px 10px; text-align: right; }
th { background: #f2f2f2; }
td:first-child, th:first-child { text-align: left; }
caption { caption-side: bottom; color: #555; font-size: 0.9em; text-align: left; padding-top: 4px; }
nav a { margin-right: 14px; }
"""


def _cell(value: object) -> str:
    if isinstance(value, float):
        text = f"{value:.4g}" if abs(value) < 1e4 else f"{value:,.0f}"
    elif isinstance(value, int) and not isinstance(value, bool):
        text = f"{value:,}"
    else:
        text = str(value)
    return html.escape(text)


def _png_data_uri(path: Path) -> str:
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise VitkitError(f"{path}: cannot read figure for the report ({e})") from None
    if not data.startswith(b"\x89PNG\r\n\x1a\n"):
        raise VitkitError(f"{path}: not a PNG file; the report embeds PNGs only")
    return "data:image/png;base64," + base64.b64encode(data).decode("ascii")


def _anchor(i: int) -> str:
    return f"s{i}"


def render_html(title: str, sections: Sequence[Section], *, subtitle: str = "") -> str:
    """The report as one HTML document."""
    when = datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{html.escape(title)}</title><style>{_STYLE}</style></head><body><main>",
        f"<h1>{html.escape(title)}</h1>",
        f'<p class="sub">{html.escape(subtitle + " · " if subtitle else "")}'
        f"written by vitkit on {html.escape(when)}</p>",
    ]
    if len(sections) > 1:
        links = "".join(
            f'<a href="#{_anchor(i)}">{html.escape(s.title)}</a>' for i, s in enumerate(sections)
        )
        parts.append(f"<nav>{links}</nav>")
    for i, section in enumerate(sections):
        parts.append(f'<h2 id="{_anchor(i)}">{html.escape(section.title)}</h2>')
        for item in section.items:
            if isinstance(item, str):
                parts.append(f"<p>{html.escape(item)}</p>")
            elif isinstance(item, Figure):
                alt = html.escape(item.caption or Path(item.path).stem)
                parts.append(f'<figure><img src="{_png_data_uri(item.path)}" alt="{alt}">')
                if item.caption:
                    parts.append(f"<figcaption>{html.escape(item.caption)}</figcaption>")
                parts.append("</figure>")
            elif isinstance(item, Table):
                parts.append("<table>")
                if item.caption:
                    parts.append(f"<caption>{html.escape(item.caption)}</caption>")
                if any(str(h) for h in item.header):  # a key/value table has no header
                    head = "".join(f"<th>{_cell(h)}</th>" for h in item.header)
                    parts.append(f"<tr>{head}</tr>")
                for row in item.rows:
                    parts.append("<tr>" + "".join(f"<td>{_cell(v)}</td>" for v in row) + "</tr>")
                parts.append("</table>")
            else:
                raise TypeError(f"a report section holds str, Figure or Table, not {type(item)}")
    parts.append("</main></body></html>\n")
    return "\n".join(parts)


def write_html(
    path: str | os.PathLike[str], title: str, sections: Sequence[Section], *, subtitle: str = ""
) -> Path:
    """Render the report and write it atomically to ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, render_html(title, sections, subtitle=subtitle))
    return path
