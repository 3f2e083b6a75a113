"""The python code blocks of docs/extending.md, read from the document so that tests run its recipes as
written (a recipe that stops working fails its test)."""

from __future__ import annotations

import re
from pathlib import Path

DOC = Path(__file__).resolve().parents[2] / "docs" / "extending.md"


def recipe(filename: str) -> str:
    """The python block of docs/extending.md whose first line is `# <filename>...`."""
    for block in re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S):
        if block.startswith(f"# {filename}"):
            return block
    raise AssertionError(f"docs/extending.md has no python block for {filename}")


def recipe_file(filename: str, folder: Path) -> Path:
    """Write the recipe `filename` of docs/extending.md into `folder` (created); its path."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / filename
    path.write_text(recipe(filename))
    return path
