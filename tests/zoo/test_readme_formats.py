"""The README names `--format`'s values as the CLI takes them: it said "or the bundle itself"
where the value to type is `safetensors`."""

from __future__ import annotations

from pathlib import Path

from oscar_zoo.zoo.cli.client_cmds import FORMAT_CHOICE
from oscar_zoo.zoo.export import FORMATS

README = Path(__file__).resolve().parents[2] / "README.md"


def test_the_readme_names_every_format_value():
    text = " ".join(README.read_text().split())     # sentences wrap
    said = text[text.index("`--format` picks"):].split(". ")[0]
    assert set(FORMAT_CHOICE.choices) == set(FORMATS)
    for fmt in FORMATS:
        assert f"`{fmt}`" in said, said
