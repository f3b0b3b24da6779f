"""API tokens: a live token's name is unique (a partial unique index: revoked tokens keep theirs).
A name is the actor that the audit log and every created_by record; two live tokens named `ci`
made those records ambiguous, and `tokens revoke ci` refused to pick one.

Live duplicates already stored are renamed, all but the oldest: `<name>-<id>`, with an audit
event each, so that the index can be built. So is a live `token-<n>` of a token whose id is not
n (named so before names were checked): an unnamed token of id n is named that (an old default
name of that form, a piece of the token, becomes `token-<id>`). Their earlier records keep the
name they were made under. The downgrade drops the index and keeps the new names.

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-26
"""

import re
from datetime import datetime, timezone

import sqlalchemy as sa
from alembic import op

revision = '0009'
down_revision = '0008'
branch_labels = None
depends_on = None

BY = "migration 0009"
INDEX = 'uq_api_tokens_live_name'
LIVE = sa.text('revoked_at IS NULL')
NAME_MAX = 194           # registry_db/tokens.py: "token:" + name fits the 200-character actor
AUTO_NAME = re.compile(r"token-\d+")   # registry_db/tokens.py: an unnamed token's name, token-<id>
tokens = sa.table('api_tokens', sa.column('id', sa.Integer), sa.column('name', sa.String),
                  sa.column('prefix', sa.String), sa.column('revoked_at', sa.DateTime))
audit = sa.table('audit_log', sa.column('at', sa.DateTime), sa.column('actor', sa.String),
                 sa.column('action', sa.String), sa.column('target', sa.String),
                 sa.column('detail', sa.JSON))


def upgrade() -> None:
    _rename_live_duplicates(op.get_bind())
    op.create_index(INDEX, 'api_tokens', ['name'], unique=True, sqlite_where=LIVE,
                    postgresql_where=LIVE)


def _rename_live_duplicates(bind) -> None:
    now = datetime.now(timezone.utc)
    if bind.dialect.name == "sqlite":     # as models.UTCDateTime stores it there: naive UTC
        now = now.replace(tzinfo=None)
    live = bind.execute(sa.select(tokens.c.id, tokens.c.name, tokens.c.prefix)
                        .where(tokens.c.revoked_at.is_(None)).order_by(tokens.c.id)).all()
    taken: set[str] = set()
    renamed = []
    for token_id, name, prefix in live:
        # token-<n> is the name create_token gives the unnamed token of id n: a live token
        # holding it for another id would make that insert fail on the index
        if name in taken or (AUTO_NAME.fullmatch(name) and name != f"token-{token_id}"):
            renamed.append((token_id, name, prefix))
        else:
            taken.add(name)
    for token_id, name, prefix in renamed:
        shown = name
        if prefix and name == f"token-{prefix[4:10]}":
            # the old default name, a piece of the secret (tokens._public_name shows it by id)
            new, shown = _free_name(f"token-{token_id}", "", taken), "(its default name)"
        else:
            new = _free_name(name, str(token_id), taken)
        taken.add(new)
        bind.execute(tokens.update().where(tokens.c.id == token_id).values(name=new))
        bind.execute(audit.insert().values(at=now, actor=BY, action="token.rename",
                                           target=f"token:{token_id}",
                                           detail={"from": shown, "to": new}))


def _free_name(name: str, suffix: str, taken: set[str]) -> str:
    """<name>-<suffix> (<name> for no suffix), shortened to fit; -2, -3, ... after it if a live
    token has that name."""
    n = 1
    while True:
        tail = (f"-{suffix}" if suffix else "") + (f"-{n}" if n > 1 else "")
        new = name[:NAME_MAX - len(tail)] + tail
        if new not in taken:
            return new
        n += 1


def downgrade() -> None:
    op.drop_index(INDEX, table_name='api_tokens', sqlite_where=LIVE, postgresql_where=LIVE)
