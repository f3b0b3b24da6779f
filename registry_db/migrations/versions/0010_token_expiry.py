"""API tokens: an optional expiry (`oscar-zoo tokens create --expires-in 90d`); past it the
token is refused (registry_db/tokens.py). Tokens stored before never expire (NULL).

The downgrade revokes the tokens that have expired (an audit event each): the code before this
migration knows no expiry and would take them again. Tokens not yet expired lose their expiry
and stay good until revoked.

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-27
"""

from datetime import datetime, timezone

import sqlalchemy as sa
from alembic import op

revision = '0010'
down_revision = '0009'
branch_labels = None
depends_on = None

BY = "migration 0010 downgrade"
UTC = sa.DateTime(timezone=True)
tokens = sa.table('api_tokens', sa.column('id', sa.Integer), sa.column('revoked_at', sa.DateTime),
                  sa.column('expires_at', sa.DateTime))
audit = sa.table('audit_log', sa.column('at', sa.DateTime), sa.column('actor', sa.String),
                 sa.column('action', sa.String), sa.column('target', sa.String),
                 sa.column('detail', sa.JSON))


def upgrade() -> None:
    with op.batch_alter_table('api_tokens', schema=None) as batch_op:
        batch_op.add_column(sa.Column('expires_at', UTC, nullable=True))


def downgrade() -> None:
    _revoke_expired(op.get_bind())
    with op.batch_alter_table('api_tokens', schema=None) as batch_op:
        batch_op.drop_column('expires_at')


def _revoke_expired(bind) -> None:
    now = datetime.now(timezone.utc)
    if bind.dialect.name == "sqlite":     # as models.UTCDateTime stores it there: naive UTC
        now = now.replace(tzinfo=None)
    expired = bind.execute(sa.select(tokens.c.id).where(
        tokens.c.revoked_at.is_(None), tokens.c.expires_at <= now)).scalars().all()
    for token_id in expired:
        bind.execute(tokens.update().where(tokens.c.id == token_id).values(revoked_at=now))
        bind.execute(audit.insert().values(at=now, actor=BY, action="token.revoke",
                                           target=f"token:{token_id}",
                                           detail={"why": "expired; the older schema has no "
                                                          "expiry"}))
