"""`oscar-zoo settings`: every setting, its env var, and its current value."""

from __future__ import annotations

import sys

import click

from .. import settings
from ..errors import ConfigError
from .output import emit, json_option


@click.command("settings")
@json_option
def settings_command(as_json: bool):
    """Show every setting with its env var and current value."""
    rows = [{"name": s.name, "env": s.env, "help": s.help, **_value(s)} for s in settings.SETTINGS]
    emit(rows, as_json, _table)
    if any("invalid" in r for r in rows):
        sys.exit(1)


def _value(s: settings.Setting) -> dict:
    """The value, or why it is invalid: this is the command that finds a bad one, so one bad
    variable must not hide the others."""
    try:
        value = settings.shown(s.name)
    except ConfigError as e:
        return {"value": None, "invalid": str(e)}
    return {"value": value if value is None or isinstance(value, (bool, int, float, str, list))
            else str(value)}


def _table(rows: list[dict]) -> str:
    """One line per setting, each column as wide as its widest cell: a fixed width let a long
    value (database_url holds the data dir's whole path) push its help out of line."""
    cells = [(r["env"], _cell(r), r["help"]) for r in rows]
    env_w = max(len(env) for env, _, _ in cells)
    value_w = max(len(value) for _, value, _ in cells)
    return "\n".join(f"{env:{env_w}}  {value:{value_w}}  {help_}" for env, value, help_ in cells)


def _cell(row: dict) -> str:
    if "invalid" in row:    # the help column beside it says what is wanted
        return f"INVALID: {settings.raw(row['name'])!r}"
    value = row["value"]
    if value is None:
        return "unset"
    if isinstance(value, bool):   # as the variable is written (OSCAR_ZOO_OFFLINE=1) and documented
        return "1" if value else "0"
    if isinstance(value, float) and value.is_integer():   # 120, as docs/settings.md, not 120.0
        return str(int(value))
    return ",".join(map(str, value)) if isinstance(value, list) else str(value)


def register(cli: click.Group) -> None:
    cli.add_command(settings_command)
