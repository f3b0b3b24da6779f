"""`--help` as a user reads it: examples one per line, options that say what they do and their
defaults, no names that are not arguments."""

from __future__ import annotations

import re

import pytest
from click.testing import CliRunner

from oscar_zoo.zoo.cli.main import cli


def _help(*command: str) -> str:
    r = CliRunner().invoke(cli, [*command, "--help"], terminal_width=100)
    assert r.exit_code == 0, r.output
    return r.stdout


def _option(text: str, name: str) -> str:
    """The help of one option: its line and the indented lines after it."""
    m = re.search(rf"^  {re.escape(name)}\b.*(?:\n {{6,}}\S.*)*", text, re.M)
    assert m, f"{name} not in\n{text}"
    return " ".join(m.group(0).split())


def test_alias_examples_are_one_per_line():
    """click rewrapped the two examples into one line (no \\b before them)."""
    lines = _help("alias").splitlines()
    assert any(line.strip() == 'oscar-zoo alias qwen3-8b@3 recommended --reason "lower loss on GPQA"'
               for line in lines)
    assert any(line.strip() == "oscar-zoo alias qwen3-8b@latest recommended" for line in lines)


def test_worker_help_names_its_option_not_an_argument():
    text = _help("worker")
    assert "REGISTRY" not in text.split("Options:")[0]       # it takes no argument of that name
    assert "--registry" in text.split("Options:")[0]


@pytest.mark.parametrize("command, option, says", [
    ("calibrate", "--validate / --no-validate", "[default: no-validate]"),
    ("calibrate", "--seed", "windows"),
    ("validate", "--context-len", "Tokens per evaluation window"),
    ("validate", "--windows", "--context-len tokens"),
])
def test_options_say_what_they_do_and_their_default(command, option, says):
    text = _option(_help(command), option)
    assert says in text, text
    assert not re.fullmatch(rf"{re.escape(option)} \S+ \[default: \S+\]", text), text  # not bare


def test_logout_is_listed_beside_login_and_says_what_it_cannot_undo():
    commands = _help().split("Commands:")[1]
    assert re.search(r"^  login\b", commands, re.M) and re.search(r"^  logout\b", commands, re.M)
    text = " ".join(_help("logout").split())
    assert "OSCAR_ZOO_TOKEN" in text and "until its operator revokes it" in text
    assert "--json" in text
