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


def _number_to_yank(client, spec: str, reason: str) -> tuple[str, int]:
    """(name, number) of yank's NAME@VERSION: an alias is refused, naming the version it points
    at now and the yank command that names it (with `reason`, quoted for the shell)."""
    import shlex

    name, ref = _version_spec(spec)
    if isinstance(ref, int):
        return name, ref
    number = client.version(name, ref, cache_hint=False)["version"]
    raise InvalidInput(f"name the version: {name}@{ref} points at version {number} now, and an "
                       f"alias moves off a version once it is yanked: run twice, `yank {spec}` "
                       f"would yank two. Run `oscar-zoo yank {name}@{number} --reason "
                       f"{shlex.quote(reason)}`")


def _line(d: dict) -> str:
    aliases = f" [{', '.join(d['aliases'])}]" if d.get("aliases") else ""
    reason = f": {d['yank_reason']}" if d.get("yank_reason") else ""
    return f"{d['model']} v{d['version']} is {d['status']}{reason}{aliases}"


@click.command("promote")
@click.argument("spec", metavar="NAME@VERSION")
@json_option
def promote_command(spec, as_json):
    """Publish a draft version (one from `publish --status draft` or a job's --draft), named
    by its number."""
    from ..registry_client import RegistryClient

    with RegistryClient() as client:
        name, ref = _version_spec(spec)
        if not isinstance(ref, int):
            raise InvalidInput(_drafts_to_promote(client, name, ref))
        emit(client.promote(name, ref), as_json, _line)


def _drafts_to_promote(client, name: str, alias: str) -> str:
    """An alias points at a published version, never at a draft: what there is to promote."""
    drafts = [d["version"] for d in client.versions(name, status="draft", cache_hint=False)]
    which = (f"its drafts: {', '.join(map(str, drafts[:10]))}; run `oscar-zoo promote "
             f"{name}@{drafts[0]}`" if drafts else f"{name} has no draft to promote")
    return (f"promote takes a draft's number, not an alias: {name}@{alias} can only point at a "
            f"published version; {which}")


@click.command("yank")
@click.argument("spec", metavar="NAME@VERSION")
@click.option("--reason", required=True, help="Why; shown to everyone who pulls it.")
@json_option
def yank_command(spec, reason, as_json):
    """Withdraw a version: it leaves `latest` and every alias, pulls of it warn, it stays
    downloadable by number. On the hub mirrors that hold it, the registry records the yank, and
    its tag there keeps its files (see the note it prints). Yanking a yanked version changes
    nothing and says so (action "already yanked" in --json). VERSION is a number: an alias
    moves off a version once it is yanked, so a retry by alias would yank another one."""
    from ..registry_client import RegistryClient

    if not reason.strip():      # said here, before any request, in the words of this command
        raise click.BadParameter("it is empty: say why the version is withdrawn (everyone who "
                                 "pulls it is shown the reason)", param_hint="'--reason'")
    with RegistryClient() as client:
        name, ref = _number_to_yank(client, spec, reason)
        before = client.version(name, ref, cache_hint=False)
        row = _yank(client, name, ref, reason, before)
        row["mirrors"] = _mirrors_of(client, row["model"], row["version"])
    emit(row, as_json, _yank_line)
    if row["action"] == "already yanked":
        if (before.get("yank_reason") or "") != reason:
            warn(f"it keeps the reason it was yanked with ({before.get('yank_reason')}); a "
                 "yank's reason is not changed afterwards")
        return
    removed = [a for a in before.get("aliases") or [] if a != "latest"]
    if removed:     # a deploy pinned to one of them stops resolving: say so now
        warn(f"removed aliases: {', '.join(removed)} (they pointed at this version); point "
             f"them elsewhere with `oscar-zoo alias {name}@VERSION ALIAS`")
    if row["mirrors"]:
        warn(_mirrors_note(row["model"], row["version"], row["mirrors"]))


def _yank(client, name: str, ref, reason: str, before: dict) -> dict:
    """The version after the yank, with `action`: "yanked", or "already yanked" where it was
    (then nothing is sent: the registry refuses a second yank, and the state asked for holds)."""
    from ..errors import Conflict

    if before.get("status") == "yanked":
        return {**before, "action": "already yanked"}
    try:
        return {**client.yank(name, ref, reason), "action": "yanked"}
    except Conflict:
        # yanked by someone else since `before` was read: the same outcome for this call
        now = client.version(name, before["version"], cache_hint=False)
        if now.get("status") != "yanked":
            raise
        return {**now, "action": "already yanked"}


def _mirrors_of(client, model: str, number: int) -> list[dict] | None:
    """The hub repos the registry mirrored this version to (records with status done), each
    with the tag that keeps its files there; None when the registry cannot say."""
    from ..errors import OscarZooError
    from ..mirror.layout import tag_name

    try:
        records = client.mirrors(model, number)
    except OscarZooError as e:
        warn(f"could not list the mirrors of {model} v{number} ({e}); `oscar-zoo mirror "
             f"{model}@{number} --status` shows them, and the hubs they are on keep its tag")
        return None
    return [{"target": r["target"], "repo": r["repo"], "path": r.get("path"),
             "tag": tag_name(model, number), "url": r.get("url")}
            for r in records if r.get("status") == "done"]


def _mirrors_note(model: str, number: int, mirrors: list[dict]) -> str:
    where = ", ".join(f"{m['target']}:{m['repo']}" for m in mirrors)
    return (f"{model} v{number} stays on its mirrors ({where}) under its tag "
            f"{mirrors[0]['tag']}: oscar-zoo never moves or deletes a tag. The registry records "
            "the yank there in the background: their oscar-zoo.json marks it yanked (a pull "
            "from them warns and no longer picks it as latest) and their main branch drops it "
            "(its folder gets the newest version not yanked, if any). `oscar-zoo mirror "
            f"{model}@{number} --status` shows "
            "whether each got it; where one did not, `oscar-zoo mirror "
            f"{model}@{number}` on the registry's host records it again. To take its files "
            "down from a hub, delete the tag there")


def _yank_line(d: dict) -> str:
    if d["action"] == "already yanked":
        return f"{d['model']} v{d['version']} was already yanked: {d.get('yank_reason')}"
    return _line(d)


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

    if "@" in name:     # `unalias NAME@3 prod`: an alias is removed from the model, not a version
        model = name.partition("@")[0]
        raise InvalidInput(f"unalias takes NAME ALIAS, without a version: `oscar-zoo unalias "
                           f"{model} {alias}` removes {alias} from {model}, whichever version it "
                           "points at")
    with RegistryClient() as client:
        body = client.remove_alias(name, alias, reason)
    emit(body, as_json, lambda d: f"{d['model']}@{alias} removed")


def register(cli: click.Group) -> None:
    for cmd in (promote_command, yank_command, alias_command, unalias_command):
        cli.add_command(cmd)
