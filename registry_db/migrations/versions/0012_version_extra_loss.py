"""Bundle versions: `extra_loss`, the extra next-token loss over BF16 of the version's own
validation report (variant "bundle", delta_nll), copied out of the `validation` JSON so that
the web UI's lists sort and page by it in SQL (JSON paths differ between SQLite and
PostgreSQL). NULL: no report, or no finite number in it. Publish writes it with the row, and
a version's report never changes after, so the backfill here is the only other writer.

The downgrade drops the column: the JSON it was copied from stays.

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-28
"""

import math

import sqlalchemy as sa
from alembic import op

revision = '0012'
down_revision = '0011'
branch_labels = None
depends_on = None

BATCH = 500     # reports hold per-layer lists: a batch at a time, not every row's at once
versions = sa.table('bundle_versions', sa.column('id', sa.Integer),
                    sa.column('validation', sa.JSON), sa.column('extra_loss', sa.Float))


def _extra_loss(validation):
    # registry_db/models.py extra_loss, as it is today: a migration must not change with it
    rows = (validation or {}).get("variants")
    by = {r.get("name"): r for r in rows if isinstance(r, dict)} if isinstance(rows, list) else {}
    found = by.get("bundle", {}).get("delta_nll")
    if isinstance(found, bool) or not isinstance(found, (int, float)) or not math.isfinite(found):
        return None
    return float(found)


def upgrade() -> None:
    with op.batch_alter_table('bundle_versions', schema=None) as batch_op:
        batch_op.add_column(sa.Column('extra_loss', sa.Float(), nullable=True))
    bind = op.get_bind()
    after = None
    while True:
        query = (sa.select(versions.c.id, versions.c.validation)
                 .where(versions.c.validation.is_not(None)).order_by(versions.c.id).limit(BATCH))
        if after is not None:
            query = query.where(versions.c.id > after)
        rows = bind.execute(query).all()
        if not rows:
            return
        found = [{"row": i, "loss": loss} for i, loss in
                 ((i, _extra_loss(v)) for i, v in rows) if loss is not None]
        if found:
            bind.execute(versions.update().where(versions.c.id == sa.bindparam("row"))
                         .values(extra_loss=sa.bindparam("loss")), found)
        after = rows[-1][0]


def downgrade() -> None:
    with op.batch_alter_table('bundle_versions', schema=None) as batch_op:
        batch_op.drop_column('extra_loss')
