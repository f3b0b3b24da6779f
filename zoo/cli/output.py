"""CLI output conventions: data on stdout (JSON with --json), progress and warnings on stderr."""

from __future__ import annotations

import json
import sys
from collections import Counter
from typing import Any, Callable, Iterable

import click

json_option = click.option("--json", "as_json", is_flag=True, help="Machine-readable JSON on stdout.")


def plural(n: int, word: str) -> str:
    """1 layer, 2 layers, 0 layers (the nouns counted here take an s)."""
    return f"{n} {word}{'' if n == 1 else 's'}"


def window_note(validation: dict[str, Any]) -> str:
    """'26 sliding-window layers hold 512 tokens' for a report (a Validation as JSON) whose
    windowed layers kept fewer tokens than its context, the reason its bits_at_context is above
    a full cache's; '' where none did, and for reports from before window_by_layer."""
    held = Counter(w for w in (validation.get("window_by_layer") or {}).values()
                   if w < validation["context_len"])
    return ", ".join(f"{n} sliding-window {'layer holds' if n == 1 else 'layers hold'} {w} tokens"
                     for w, n in sorted(held.items()))


def emit(data: Any, as_json: bool, human: Callable[[Any], str] | None = None) -> None:
    if as_json or human is None:
        click.echo(json.dumps(data, indent=2, sort_keys=False, default=str))
    else:
        click.echo(human(data))


def warn(message: str) -> None:
    click.echo(click.style("warning: ", fg="yellow") + message, err=True)


def warn_unless_json(messages: Iterable[str], as_json: bool) -> None:
    """Each message as a warning on stderr, unless --json: the JSON on stdout carries them (a
    recipe's notes, convert's notes), and a tool reading it gets them there, once."""
    if not as_json:
        for message in messages:
            warn(message)


def info(message: str) -> None:
    click.echo(message, err=True)


def progress_enabled() -> bool:
    return sys.stderr.isatty()
