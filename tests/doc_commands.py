"""The ``vitkit ...`` lines of a documentation page's bash blocks, for the tests that run a
page's examples as written (the README's own are tests/test_readme.py's)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def page_commands(page: str, section: str | None = None) -> list[str]:
    """Every ``vitkit`` command of ``page``'s (a path under the repository) bash blocks,
    continuations joined and comments cut; with ``section``, only under that ``## `` heading."""
    text = (ROOT / page).read_text()
    if section is not None:
        found = re.search(rf"^## {re.escape(section)}\n(.*?)(?=^## |\Z)", text, re.S | re.M)
        assert found, f"{page} lost its section {section!r}"
        text = found.group(1)
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split("  #")[0].strip()
            if line.startswith("vitkit "):
                commands.append(" ".join(line.split()))
    return commands
