"""`oscar-zoo mirror`: push a published version to the Hugging Face Hub and ModelScope."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from .output import emit, json_option


@click.command("mirror")
@click.argument("spec", metavar="NAME@VERSION")
@click.option("--to", "targets", multiple=True, metavar="hf:ORG/REPO|modelscope:ORG/REPO",
              help="Where to (repeatable). Default: the mirror_targets setting.")
@click.option("--status", "show_status", is_flag=True,
              help="Only show where this version is mirrored (the registry's records).")
@json_option
def mirror_command(spec, targets, show_status, as_json):
    """Mirror a registry version to hub repos in the RotationZoo layout, tagged <model>-v<N>.

    Runs against the local registry (the data dir or OSCAR_ZOO_DATABASE_URL, like `serve`).
    Safe to re-run: what a hub already has is neither uploaded nor committed again. Only
    published versions are mirrored; for a yanked one, this records the yank in the index of
    the mirrors that hold it and takes its files off their main branch (the model's folder gets
    the newest version not yanked; the yanked version's tag keeps its files); a --to target it
    was never mirrored to is skipped, having no yank to record. Tokens come from HF_TOKEN and
    MODELSCOPE_API_TOKEN.

    \b
    oscar-zoo mirror glm-4.7-fp8@3 --to hf:oscar-zoo/rotations --to modelscope:oscar-zoo/rotations
    oscar-zoo mirror glm-4.7-fp8@3 --status
    """
    from ..sources.base import parse_spec

    name, ref = parse_spec(spec)
    if ref.is_default:
        raise click.UsageError("name the version: NAME@VERSION (a number or an alias)")
    version = ref.version if ref.version is not None else ref.alias
    if show_status:
        emit(_records(name, version), as_json, _records_text)
        return
    from ...registry_db.mirrors import NotPublished, mirror_version, mirror_yank

    registry = _registry_here()
    try:
        try:
            results = mirror_version(registry, name, version, list(targets) or None)
        except NotPublished as e:
            if e.status != "yanked":
                raise
            # a yanked version goes nowhere new; the mirrors holding it get the yank again
            click.echo(f"{e}; recording the yank on the mirrors that hold it", err=True)
            results = mirror_yank(registry, name, version, list(targets) or None)
    finally:
        registry.close()
    emit([r.to_dict() for r in results], as_json, _results_text)
    if any(r.status == "failed" for r in results):
        sys.exit(1)


def _registry_here():
    """The registry this host serves. Mirroring reads its database and blob store, so it does
    not go through OSCAR_ZOO_ENDPOINT; and on a host without one it must not create one."""
    from ...registry_db.registry import open_registry
    from ...registry_db.session import default_url
    from .. import settings
    from ..errors import ConfigError
    from ..registry_client import RegistryClient

    endpoint = RegistryClient().where
    if endpoint:
        raise ConfigError(
            f"`oscar-zoo mirror` pushes from the registry's own database and blobs, so it runs "
            f"on the registry's host, and OSCAR_ZOO_ENDPOINT here points at {endpoint}. Run it "
            "there (without OSCAR_ZOO_ENDPOINT), or set OSCAR_ZOO_MIRROR_TARGETS on the server "
            "so that every publish mirrors by itself; `--status` works from here")
    if not settings.raw("database_url"):
        url = default_url(settings.get("data_dir"))
        if not Path(url.removeprefix("sqlite:///")).is_file():
            raise ConfigError(
                f"no registry on this host ({url.removeprefix('sqlite:///')} does not exist): "
                "run mirror where `oscar-zoo serve` keeps its data (OSCAR_ZOO_DATA_DIR or "
                "OSCAR_ZOO_DATABASE_URL)")
    return open_registry()


def _results_text(rows: list[dict]) -> str:
    if not rows:    # a yanked version no mirror holds (mirror_yank)
        return "no mirror holds this version: no yank to record"
    lines = []
    for r in rows:
        if r["status"] == "skipped":
            lines.append(f"{r['target']}:{r['repo']}  skipped: {r['note']}")
        elif r["status"] == "done" and r["path"] is None:   # a yank recorded (mirror_yank)
            what = "yank recorded, main branch updated" if r["committed"] else "nothing to change"
            lines.append(f"{r['target']}:{r['repo']}  {what}")
        elif r["status"] == "done":
            what = (r.get("note") or "committed") if r["committed"] else "already there, nothing uploaded"
            lines.append(f"{r['target']}:{r['repo']}  {r['path']}  tag {r['tag']}  "
                         f"commit {str(r['revision'])[:12]}  ({what})")
        else:
            lines.append(f"{r['target']}:{r['repo']}  FAILED: {r['error']}")
    return "\n".join(lines)


def _records(name: str, version) -> list[dict]:
    from ..registry_client import RegistryClient

    client = RegistryClient()
    if client.configured:
        with client:
            return client.mirrors(name, version)
    from ...api.serialize import mirror
    from ...registry_db import queries
    from ...registry_db.registry import open_registry

    registry = open_registry()
    try:
        with registry.db.read() as session:
            model = queries.resolve_model(session, name)
            v = queries.resolve_version(session, model, version)
            return [mirror(r) for r in queries.mirrors(session, v)]
    finally:
        registry.close()


def _records_text(rows: list[dict]) -> str:
    if not rows:
        return "not mirrored anywhere yet"
    return "\n".join(f"{r['target']}:{r['repo']}  {r['status']:<8} {r.get('path') or '-'}  "
                     f"{(r.get('revision') or '-')[:12]}  {r.get('error') or r.get('url') or ''}"
                     for r in rows)


def register(cli: click.Group) -> None:
    cli.add_command(mirror_command)
