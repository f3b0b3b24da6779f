"""`oscar-zoo settings`: every setting, its env var, and its current value."""

from __future__ import annotations

import click

from .. import settings
from .output import emit, json_option


@click.command("settings")
@json_option
def settings_command(as_json: bool):
    """Show every setting with its env var and current value."""
    rows = [{"name": s.name, "env": s.env, "help": s.help, "value": _show(settings.shown(s.name))}
            for s in settings.SETTINGS]
    emit(rows, as_json, lambda rs: "\n".join(f"{r['env']:36} {r['value']!s:40} {r['help']}" for r in rs))


def _show(value):
    return value if value is None or isinstance(value, (bool, int, float, str, list)) else str(value)


def register(cli: click.Group) -> None:
    cli.add_command(settings_command)
