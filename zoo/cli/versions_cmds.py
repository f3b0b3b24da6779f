"""Writes to a model's published versions: promote a draft, yank a version, move or remove an
alias.

Versions are immutable; these change only a version's status or which version an alias names,
and the registry keeps the history of both. Each needs a token with scope bundles:publish.
"""

from __future__ import annotations

import click

from ..errors import InvalidInput
from .output import emit, json_option, warn


def _version_spec(spec: str) -> tuple[str, str | int]:
    from ..sources.base import parse_spec

    name, ref = parse_spec(spec)
    if ref.is_default:
        raise InvalidInput(f"say which version: {name}@VERSION (a number, or an alias such as "
                           f"{name}@latest)")
    return name, ref.version if ref.version is not None else ref.alias


def _line(d: dict) -> str:
    aliases = f" [{', '.join(d['aliases'])}]" if d.get("aliases") else ""
    reason = f": {d['yank_reason']}" if d.get("yank_reason") else ""
    return f"{d['model']} v{d['version']} is {d['status']}{reason}{aliases}"


@click.command("promote")
@click.argument("spec", metavar="NAME@VERSION")
@json_option
def promote_command(spec, as_json):
    """Publish a draft version (one from `publish --status draft` or a job's --draft)."""
    from ..registry_client import RegistryClient

    name, ref = _version_spec(spec)
    with RegistryClient() as client:
        emit(client.promote(name, ref), as_json, _line)


@click.command("yank")
@click.argument("spec", metavar="NAME@VERSION")
@click.option("--reason", required=True, help="Why; shown to everyone who pulls it.")
@json_option
def yank_command(spec, reason, as_json):
    """Withdraw a version: it leaves `latest` and every alias, pulls of it warn, it stays
    downloadable by number."""
    from ..registry_client import RegistryClient

    name, ref = _version_spec(spec)
    with RegistryClient() as client:
        before = client.version(name, ref, cache_hint=False).get("aliases") or []
        emit(client.yank(name, ref, reason), as_json, _line)
    removed = [a for a in before if a != "latest"]
    if removed:     # a deploy pinned to one of them stops resolving: say so now
        warn(f"removed aliases: {', '.join(removed)} (they pointed at this version); point "
             f"them elsewhere with `oscar-zoo alias {name}@VERSION ALIAS`")


@click.command("alias")
@click.argument("spec", metavar="NAME@VERSION")
@click.argument("alias")
@click.option("--reason", help="Why; kept in the alias history.")
@json_option
def alias_command(spec, alias, reason, as_json):
    """Point ALIAS (e.g. recommended) at a published version.

    \b
      oscar-zoo alias qwen3-8b@3 recommended --reason "lower loss on GPQA"
      oscar-zoo alias qwen3-8b@latest recommended
    """
    from ..registry_client import RegistryClient

    name, ref = _version_spec(spec)
    with RegistryClient() as client:
        version = ref if isinstance(ref, int) else client.version(name, ref, cache_hint=False)["version"]
        body = client.set_alias(name, alias, version, reason)
    emit(body, as_json, lambda d: f"{d['model']}@{alias} -> v{version}")


@click.command("unalias")
@click.argument("name")
@click.argument("alias")
@click.option("--reason", help="Why; kept in the alias history.")
@json_option
def unalias_command(name, alias, reason, as_json):
    """Remove ALIAS from model NAME (pulls of NAME@ALIAS then fail; `latest` cannot be removed).

      oscar-zoo unalias qwen3-8b canary --reason "rollout finished"
    """
    from ..registry_client import RegistryClient

    with RegistryClient() as client:
        body = client.remove_alias(name, alias, reason)
    emit(body, as_json, lambda d: f"{d['model']}@{alias} removed")


def register(cli: click.Group) -> None:
    for cmd in (promote_command, yank_command, alias_command, unalias_command):
        cli.add_command(cmd)
