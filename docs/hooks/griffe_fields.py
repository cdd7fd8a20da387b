"""A Griffe extension for the API reference: a dataclass's fields as a table in its docstring.

vitkit's config dataclasses (``ViTConfig``, ``PreprocessConfig``, ``TrainConfig``, ...) say what
each field means in a comment on the field's line, not in a docstring. This extension reads
those comments from the source and appends a table (field, type, default, meaning) to the
class's docstring, so a class with sixty fields reads as one table (the fields have no
docstring of their own, so they are not listed again as members).

A comment whose sentence runs on (it ends in ``;``, ``,``, ``:`` or a word such as "with")
continues on the comment-only lines below it; a field with no comment on its own lines takes the
comment-only lines right above it, unless they are a section's one- or two-word title.
"""

from __future__ import annotations

import ast
import html
import io
import tokenize
from typing import Any

import griffe


def _comments(code: str) -> dict[int, tuple[str, bool]]:
    """Line number -> (comment text, whether the line holds nothing but the comment)."""
    found: dict[int, tuple[str, bool]] = {}
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(code).readline))
    except (tokenize.TokenError, SyntaxError):
        return found
    lines = code.splitlines()
    for tok in tokens:
        if tok.type == tokenize.COMMENT:
            row, col = tok.start
            alone = not lines[row - 1][:col].strip()
            found[row] = (tok.string.lstrip("#").strip(), alone)
    return found


def _own(comments: dict[int, tuple[str, bool]], start: int, end: int) -> list[str]:
    """The comments on a statement's own lines (after code)."""
    return [comments[i][0] for i in range(start, end + 1) if i in comments and not comments[i][1]]


_RUNS_ON = ("with", "and", "or", "the", "a", "an", "of", "to", "in", "for", "by", "than")


def _runs_on(text: str) -> bool:
    """Whether a comment's sentence continues on the next line."""
    words = text.split()
    return text.endswith((";", ",", ":")) or bool(words) and words[-1] in _RUNS_ON


def _field_comment(
    comments: dict[int, tuple[str, bool]], start: int, end: int, previous_end: int
) -> str:
    """The comment that says what the field on lines ``start..end`` is."""
    own = _own(comments, start, end)
    if own:
        text = " ".join(own)
        row = end + 1
        while _runs_on(text) and row in comments and comments[row][1]:
            text += " " + comments[row][0]
            row += 1
        return text
    above: list[str] = []
    row = start - 1
    while row > previous_end and row in comments and comments[row][1]:
        above.insert(0, comments[row][0])
        row -= 1
    if len(above) == 1 and len(above[0].split()) <= 2:
        return ""  # a section's title ("# model", "# run"), not this field's description
    return " ".join(above)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _code(text: str) -> str:
    """Code in a table cell: HTML, so that a ``|`` (``int | None``) neither ends the cell nor
    shows a backslash."""
    return f"<code>{html.escape(text).replace('|', '&#124;')}</code>"


class DataclassFieldTable(griffe.Extension):
    """Appends a field table to the docstring of every dataclass with commented fields."""

    def on_class_members(self, *, node: Any, cls: griffe.Class, agent: Any, **kwargs: Any) -> None:
        if not isinstance(node, ast.ClassDef) or not any(
            "dataclass" in ast.unparse(d) for d in node.decorator_list
        ):
            return
        code = getattr(agent, "code", None)
        if not isinstance(code, str):
            return
        comments = _comments(code)
        rows: list[str] = []
        previous_end = node.lineno
        for stmt in node.body:
            end = stmt.end_lineno or stmt.lineno
            if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                name = stmt.target.id
                member = cls.members.get(name)
                if (
                    not name.startswith("_")
                    and isinstance(member, griffe.Attribute)
                    and not member.docstring
                    and "instance-attribute" in member.labels
                ):
                    meaning = _field_comment(comments, stmt.lineno, end, previous_end)
                    kind = ast.unparse(stmt.annotation)
                    default = ast.unparse(stmt.value) if stmt.value is not None else ""
                    rows.append(
                        f"| `{name}` | {_code(kind)} | "
                        f"{_code(default) if default else ''} | {_cell(meaning)} |"
                    )
            previous_end = end
        if not any(not row.endswith("|  |") for row in rows):
            return  # no field says what it is: the table would add nothing
        table = "\n".join(
            ["**Fields**", "", "| field | type | default | meaning |", "| --- | --- | --- | --- |"]
            + rows
        )
        if cls.docstring is None:
            cls.docstring = griffe.Docstring(table, parent=cls)
        else:
            cls.docstring.value = f"{cls.docstring.value.rstrip()}\n\n{table}"
