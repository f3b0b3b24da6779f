"""`oscar-zoo mirror`: push a published version to the Hugging Face Hub and ModelScope."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from .output import emit, info, json_option


@click.command("mirror")
@click.argument("spec", metavar="NAME@VERSION")
@click.option("--to", "targets", multiple=True, metavar="hf:ORG/REPO|modelscope:ORG/REPO",
              help="Where to (repeatable). Default: the mirror_targets setting.")
@click.option("--status", "show_status", is_flag=True,
              help="Only show where this version is mirrored (the registry's records).")
@click.option("--dry-run", is_flag=True,
              help="Only show what a run would do on each hub (repo, folder, tag, the files it "
                   "would upload or delete): the hubs are read, nothing is written to them or "
                   "recorded in the registry.")
@json_option
def mirror_command(spec, targets, show_status, dry_run, as_json):
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
    oscar-zoo mirror glm-4.7-fp8@3 --dry-run
    oscar-zoo mirror glm-4.7-fp8@3 --status
    """
    from ..sources.base import parse_spec

    name, ref = parse_spec(spec)
    if ref.is_default:
        raise click.UsageError("name the version: NAME@VERSION (a number or an alias)")
    if show_status and dry_run:
        raise click.UsageError("--status shows the records of past runs and --dry-run plans the "
                               "next one: use one of them")
    version = ref.version if ref.version is not None else ref.alias
    if show_status:
        emit(_records(name, version), as_json, _records_text)
        return
    registry = _registry_here()
    try:
        # resolved once: an alias that moves during the run must not change the version
        model, number, status = _resolved(registry, name, version)
        if dry_run:
            rows = [p.to_dict() for p in _plans(registry, model, number, status, list(targets))]
        else:
            rows = [r.to_dict() for r in _run(registry, model, number, list(targets))]
    finally:
        registry.close()
    if dry_run:
        info("dry run: the hubs were only read; nothing was uploaded, tagged or recorded")
    emit(rows, as_json, _plans_text if dry_run else _results_text)
    failed = [f"{r['target']}:{r['repo']}" for r in rows
              if r.get("status") == "failed" or r.get("action") == "fail"]
    if failed:
        _fail(f"{model}@{number}", failed, len(rows), status == "yanked", dry_run, as_json)


def _resolved(registry, name: str, version) -> tuple[str, int, str]:
    """(the registry's name of the model, the version's number, its status)."""
    from ...registry_db import queries

    with registry.db.read() as session:
        m = queries.resolve_model(session, name)
        v = queries.resolve_version(session, m, version)
        return m.name, v.number, v.status


def _run(registry, model: str, number: int, targets: list[str]) -> list:
    from ...registry_db.mirrors import NotPublished, mirror_version, mirror_yank
    from ..mirror.runner import outcomes_reported_by_caller

    with outcomes_reported_by_caller():     # each target's outcome is a row of the output
        try:
            return mirror_version(registry, model, number, targets or None)
        except NotPublished as e:
            if e.status != "yanked":
                raise
            # a yanked version goes nowhere new; the mirrors holding it get the yank again
            info(f"{e}; recording the yank on the mirrors that hold it")
            return mirror_yank(registry, model, number, targets or None)


def _fail(spec: str, failed: list[str], total: int, yanked: bool, dry_run: bool,
          as_json: bool) -> None:
    """The one line saying the run did not succeed everywhere and what to do; each target's
    reason is in its own row already (stdout), so it is not repeated here."""
    where = "in its row of the JSON" if as_json else "on its line above"
    again = " ".join(f"--to {t}" for t in failed)
    if dry_run:
        said = (f"{len(failed)} of {total} targets would fail (the reason is {where}); fix "
                f"that, then `oscar-zoo mirror {spec} {again} --dry-run` checks again")
    else:
        does = "records the yank there" if yanked else "uploads only what the hub lacks"
        said = (f"{len(failed)} of {total} targets failed (the reason is {where}); once it is "
                f"fixed, run `oscar-zoo mirror {spec} {again}` again (it {does})")
    click.echo(click.style("Error: ", fg="red") + said, err=True)
    sys.exit(1)


# --- --dry-run ----------------------------------------------------------------------------------

def _plans(registry, model: str, number: int, status: str, targets: list[str]) -> list:
    """What `mirror` would do on each target (MirrorPlans), as a run would choose them."""
    from ...registry_db.mirrors import plan_version, plan_yank_version

    plan = plan_yank_version if status == "yanked" else plan_version
    return plan(registry, model, number, targets or None)


def _plans_text(rows: list[dict]) -> str:
    if not rows:
        return "no mirror holds this version: no yank to record"
    return "\n".join(_plan_text(r) for r in rows)


def _plan_text(r: dict) -> str:
    where, what = f"{r['target']}:{r['repo']}", f"{r['model']} v{r['version']}"
    if r["action"] == "fail":
        return f"{where}  {what}  would FAIL: {r['error']}"
    if r["action"] in ("nothing", "skip"):
        return f"{where}  {what}  {r['action']}: {r['note']}"
    created = ", creating the repo" if r["create_repo"] else ""
    lines = [f"{where}  {what} -> {r['folder']}  tag {r['tag']}  (would {r['action']}{created})"]
    lines += [f"  upload  {p}" for p in r["upload"]]
    lines += [f"  delete  {p}" for p in r["delete"]]
    return "\n".join(lines)


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
