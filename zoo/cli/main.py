"""Entry point: `oscar-zoo`. Heavy modules (torch, transformers, the server) load inside commands,
so `oscar-zoo --help` and the client path stay fast."""

from __future__ import annotations

import sys

import click

from .. import __version__
from ..errors import OscarZooError, is_no_space
from . import (bundle_cmds, calibrate_cmds, client_cmds, jobs_cmds, mirror_cmds, registry_cmds,
               settings_cmd, versions_cmds, worker_cmd)


class ZooGroup(click.Group):
    """Turns domain errors into one actionable line on stderr and exit code 1."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except OscarZooError as e:
            click.echo(click.style("Error: ", fg="red") + str(e), err=True)
            sys.exit(1)
        except FileExistsError as e:
            click.echo(click.style("Error: ", fg="red") + str(e), err=True)
            sys.exit(1)
        except OSError as e:    # a cache or data dir that is a file, read-only or full
            # pull and export say which directory is full (StorageFull); any other write that
            # meets a full disk at least says what to do
            fix = ("free space on that disk (`oscar-zoo prune` removes what no ref uses from the "
                   "cache); " if is_no_space(e) else "")
            click.echo(click.style("Error: ", fg="red") + f"{e} ({fix}`oscar-zoo settings` "
                       "shows the directories oscar-zoo uses and their variables)", err=True)
            sys.exit(1)
        except Exception as e:
            told = _database_unreachable(e)
            if told is None:
                raise
            click.echo(click.style("Error: ", fg="red") + str(told), err=True)
            sys.exit(1)


def _database_unreachable(e: Exception):
    """A failure to connect to the registry database (a database that does not exist, nothing
    listening on its port, a refused login) as one line naming the URL, its password masked;
    None for any other error. Only where SQLAlchemy is loaded: without it, no database was
    asked, and `oscar-zoo --help` and the client commands stay light."""
    if "sqlalchemy" not in sys.modules:
        return None
    from ...registry_db.session import connect_failure

    return connect_failure(e)


@click.group(cls=ZooGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="oscar-zoo")
def cli():
    """oscar-zoo: calibrate, validate, publish and pull OSCAR INT2 KV-cache rotations."""


for _module in (bundle_cmds, calibrate_cmds, settings_cmd, registry_cmds, client_cmds,
                versions_cmds, mirror_cmds, jobs_cmds, worker_cmd):
    _module.register(cli)


def main() -> None:
    cli(prog_name="oscar-zoo")


if __name__ == "__main__":
    main()
