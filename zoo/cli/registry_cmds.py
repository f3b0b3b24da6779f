"""`oscar-zoo serve`, `oscar-zoo db upgrade`, `oscar-zoo tokens create|list|revoke`.

All act on the registry database of the settings (OSCAR_ZOO_DATABASE_URL, else SQLite in
OSCAR_ZOO_DATA_DIR). Tokens are bootstrapped here, straight against the database: the token
is printed once on stdout and only its hash is stored. So the tokens commands run on the
registry's host: with OSCAR_ZOO_ENDPOINT set they do not make a new database (_token_registry).
"""

from __future__ import annotations

import logging

import click

from .. import settings
from ..errors import ConfigError
from .output import emit, info, json_option, warn


@click.command("serve")
@click.option("--host", default="127.0.0.1", show_default=True, help="Interface to listen on.")
@click.option("--port", default=8000, show_default=True, type=click.IntRange(0, 65535),
              help="Port (0: any free one, printed at startup).")
@click.option("--no-workers", is_flag=True, help="Do not start local calibration workers.")
@click.option("--executor", type=click.Choice(["local", "ray"]),
              help="Where jobs run [env OSCAR_ZOO_EXECUTOR, default local].")
@click.option("--ray-address", help="Ray cluster for --executor ray [env OSCAR_ZOO_RAY_ADDRESS].")
@click.option("--log-level", default="info", show_default=True,
              type=click.Choice(["critical", "error", "warning", "info", "debug"]))
def serve_command(host: str, port: int, no_workers: bool, executor: str | None,
                  ray_address: str | None, log_level: str):
    """Run the registry (API at /v1, docs at /docs) and its calibration workers; migrates an
    empty database first."""
    import os
    import socket

    import uvicorn

    from ...api.app import create_app

    # Settings are environment variables, read when used: the workers inherit these too.
    if executor:
        os.environ["OSCAR_ZOO_EXECUTOR"] = executor
    if ray_address:
        os.environ["OSCAR_ZOO_RAY_ADDRESS"] = ray_address
    app = create_app()
    if not no_workers and settings.get("executor") == "ray":
        from ...calibrate.executors.ray_executor import check_address

        check_address(settings.get("ray_address"))
    # Bind first, so the workers know the real port (also with --port 0).
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise ConfigError(f"cannot listen on {host}:{port} ({e.strerror}); pick another port "
                          "with --port (--port 0 takes a free one)") from None
    port = sock.getsockname()[1]
    local = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(host, host)
    app.state.self_url = f"http://{f'[{local}]' if ':' in local else local}:{port}"
    app.state.start_workers = not no_workers
    info(f"oscar-zoo registry on {app.state.self_url} (database: {_shown(app)})")
    config = uvicorn.Config(app, log_level=log_level, timeout_graceful_shutdown=5)
    logging.getLogger("uvicorn.access").addFilter(quiet_polls)  # after Config set logging up
    uvicorn.Server(config).run(sockets=[sock])


def quiet_polls(record: logging.LogRecord) -> bool:
    """False for an idle worker's long poll answered 204 (each worker asks every few seconds:
    the access log would be mostly these)."""
    args = record.args if isinstance(record.args, tuple) else ()
    return not (len(args) >= 5 and str(args[2]).startswith("/v1/workers/claim") and args[4] == 204)


def _shown(app) -> str:
    return settings.redact_url(app.state.registry.db.url)


@click.group("db")
def db_group():
    """The registry database schema."""


@db_group.command("upgrade")
@click.option("--revision", default="head", show_default=True, help="Target schema revision.")
def db_upgrade(revision: str):
    """Apply pending migrations, then sync the model catalog into the database."""
    from ...registry_db import migrate
    from ...registry_db.registry import sync_catalog
    from ...registry_db.session import Database

    db = Database()
    before = migrate.current(db)
    migrate.upgrade(db, revision)
    changed = sync_catalog(db)
    info(f"schema {before or '(empty)'} -> {migrate.current(db)}; {changed} catalog models updated")


@db_group.command("gc")
@click.option("--min-age", default=3600.0, show_default=True,
              help="Keep unreferenced blobs younger than this many seconds (uploads in flight).")
def db_gc(min_age: float):
    """Delete stored blobs that no version references (orphans of interrupted publishes)."""
    from ...registry_db.registry import open_registry

    removed = open_registry().collect_garbage(min_age)
    info(f"removed {len(removed)} unreferenced blob(s)")


@click.group("tokens")
def tokens_group():
    """API tokens for writes (publish, jobs, admin), in this host's registry database: run
    these on the registry's host (or with OSCAR_ZOO_DATABASE_URL set to its database)."""


def _token_registry():
    """The registry whose tokens the commands act on, named on stderr (password masked).

    A client of a remote registry (OSCAR_ZOO_ENDPOINT) has no business with this host's
    database: `tokens create` there made a new local SQLite registry and minted a token the
    remote one refused, whose 401 then sent the user back to `tokens create`. So with an
    endpoint set and neither OSCAR_ZOO_DATABASE_URL nor OSCAR_ZOO_DATA_DIR naming a database, a
    database that does not exist yet is not made (refused), and one that does is acted on with
    a warning that it is this host's (the registry's own host, an env file naming its LAN
    address or service name, is the common case and must keep working)."""
    from pathlib import Path

    from ...registry_db.registry import open_registry
    from ...registry_db.session import default_url

    url_set, dir_set = (bool(settings.raw(n)) for n in ("database_url", "data_dir"))  # no defaults
    local = None if url_set else Path(default_url(settings.get("data_dir"))[len("sqlite:///"):])
    endpoint = settings.redact_url(settings.get("endpoint") or "")
    if endpoint and not (url_set or dir_set):
        if not local.is_file():
            raise ConfigError(
                f"OSCAR_ZOO_ENDPOINT points at the registry {endpoint}, and `oscar-zoo tokens` "
                f"acts on a registry database on this host, of which there is none ({local}): a "
                "token made in a new one would be refused there. Tokens are created on the "
                "registry's host (`oscar-zoo tokens create` there) or here with "
                "OSCAR_ZOO_DATABASE_URL set to the registry's database; otherwise ask its admin "
                "for one, then `oscar-zoo login`")
        warn(f"acting on this host's registry database ({local}), not through "
             f"OSCAR_ZOO_ENDPOINT ({endpoint}): its tokens work for the registry that serves "
             "this database")
    new = local is not None and not local.is_file()
    registry = open_registry()
    info(f"{'new ' if new else ''}registry database: {settings.redact_url(registry.db.url)}")
    return registry


class Duration(click.ParamType):
    """30m, 12h, 90d, 52w: a bad form is a usage error (exit 2) naming the forms."""

    name = "duration"

    def convert(self, value, param, ctx):
        from ...registry_db.tokens import parse_duration
        from ..errors import InvalidInput

        try:
            return parse_duration(value)
        except InvalidInput as e:
            self.fail(str(e), param, ctx)


@tokens_group.command("create")
@click.option("--scope", "scopes", multiple=True, required=True,
              type=click.Choice(["bundles:publish", "jobs:submit", "jobs:work", "admin"]),
              help="Scope; repeat for several.")
@click.option("--name", default="", help="A label to recognise the token by.")
@click.option("--expires-in", type=Duration(),
              help="Refuse the token after this long: 30m, 12h, 90d, 52w. Default: never expires.")
@json_option
def tokens_create(scopes: tuple[str, ...], name: str, expires_in, as_json: bool):
    """Create a token and print it once (store it now: only its hash is kept). With --json:
    the token with its id, name, scopes and expiry."""
    from ...registry_db.tokens import create_token

    registry = _token_registry()
    with registry.db.write() as session:
        row, token = create_token(session, list(scopes), name, created_by="cli",
                                  expires_in=expires_in)
        # the fields of `tokens list --json`, plus the token
        made = {"token": token, "id": row.id, "name": row.name, "prefix": row.prefix,
                "scopes": row.scopes, "created_at": row.created_at.isoformat(),
                "expires_at": row.expires_at.isoformat() if row.expires_at else None}
    # said on every create, so that a token with no expiry is a choice someone saw
    until = (f"expires {row.expires_at.isoformat(timespec='seconds')}" if row.expires_at
             else "never expires (--expires-in 90d makes one that does)")
    info(f"token {row.name!r} ({', '.join(row.scopes)}), {until}; it is shown only this once")
    emit(made, as_json, lambda d: d["token"])


@tokens_group.command("list")
@json_option
def tokens_list(as_json: bool):
    """Tokens with their scopes, expiry and state: live, expired or revoked (never the tokens
    themselves)."""
    from ...registry_db.tokens import list_tokens, state_of

    with _token_registry().db.read() as session:
        rows = [{"id": t.id, "name": t.name, "prefix": t.prefix, "scopes": t.scopes,
                 "created_at": t.created_at.isoformat(),
                 "expires_at": t.expires_at.isoformat() if t.expires_at else None,
                 "revoked_at": t.revoked_at.isoformat() if t.revoked_at else None,
                 "state": state_of(t)}
                for t in list_tokens(session)]
    emit(rows, as_json, _human_tokens)


def _human_tokens(rows: list[dict]) -> str:
    if not rows:
        return "no tokens; create one with `oscar-zoo tokens create --scope ...`"
    head = f"{'ID':>4}  {'PREFIX':<15}  {'NAME':<24} {'SCOPES':<28}STATE"
    return "\n".join([head] + [f"{r['id']:>4}  {r['prefix'] + '...':<15}  {r['name']:<24} "
                                f"{','.join(r['scopes']):<28}{_state_shown(r)}" for r in rows])


def _state_shown(row: dict) -> str:
    """revoked <when>, expired <when>, live until <when>, or live (no expiry)."""
    if row["state"] == "revoked":
        return f"revoked {row['revoked_at'][:19]}"
    if row["state"] == "expired":
        return f"expired {row['expires_at'][:19]}"
    return f"live until {row['expires_at'][:19]}" if row["expires_at"] else "live"


@tokens_group.command("revoke")
@click.argument("ident")
def tokens_revoke(ident: str):
    """Revoke a token by id, name or prefix (shown by `tokens list`), or by the token itself
    (a leaked one: it is matched by its hash and never printed)."""
    from ...registry_db.tokens import revoke_token

    with _token_registry().db.write() as session:
        row = revoke_token(session, ident, by="cli")
    info(f"revoked token {row.id} ({row.name})")


def register(cli: click.Group) -> None:
    cli.add_command(serve_command)
    cli.add_command(db_group)
    cli.add_command(tokens_group)
