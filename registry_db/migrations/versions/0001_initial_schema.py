"""Initial schema: models, bundle versions, files, layer index, aliases with history, jobs,
mirror records, API tokens, audit log.

Revision ID: 0001
Revises:
Create Date: 2026-11-22
"""

import sqlalchemy as sa
from alembic import op

# Types spelled out here, not imported from models.py: a migration must not change when the
# models do. Bigint keys on PostgreSQL; SQLite autoincrements only INTEGER.
ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
UTC = sa.DateTime(timezone=True)

revision = '0001'
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('api_tokens',
    sa.Column('id', ID, nullable=False),
    sa.Column('name', sa.String(length=200), nullable=False),
    sa.Column('prefix', sa.String(length=16), nullable=False),
    sa.Column('token_hash', sa.String(length=64), nullable=False),
    sa.Column('scopes', sa.JSON(), nullable=False),
    sa.Column('created_at', UTC, nullable=False),
    sa.Column('created_by', sa.String(length=200), nullable=True),
    sa.Column('revoked_at', UTC, nullable=True),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_api_tokens')),
    sa.UniqueConstraint('token_hash', name=op.f('uq_api_tokens_token_hash'))
    )
    op.create_table('audit_log',
    sa.Column('id', ID, nullable=False),
    sa.Column('at', UTC, nullable=False),
    sa.Column('actor', sa.String(length=200), nullable=True),
    sa.Column('action', sa.String(length=64), nullable=False),
    sa.Column('target', sa.String(length=500), nullable=False),
    sa.Column('detail', sa.JSON(), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_audit_log'))
    )
    with op.batch_alter_table('audit_log', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_audit_log_at'), ['at'], unique=False)

    op.create_table('models',
    sa.Column('id', ID, nullable=False),
    sa.Column('name', sa.String(length=200), nullable=False),
    sa.Column('hub_id', sa.String(length=300), nullable=False),
    sa.Column('hub_id_lower', sa.String(length=300), nullable=False),
    sa.Column('architecture', sa.String(length=200), nullable=True),
    sa.Column('aliases', sa.JSON(), nullable=False),
    sa.Column('geometry', sa.JSON(), nullable=False),
    sa.Column('geometry_verified', sa.Boolean(), nullable=False),
    sa.Column('source', sa.String(length=20), nullable=False),
    sa.Column('created_at', UTC, nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_models')),
    sa.UniqueConstraint('hub_id', name=op.f('uq_models_hub_id')),
    sa.UniqueConstraint('hub_id_lower', name=op.f('uq_models_hub_id_lower')),
    sa.UniqueConstraint('name', name=op.f('uq_models_name'))
    )
    op.create_table('bundle_versions',
    sa.Column('id', ID, nullable=False),
    sa.Column('model_id', ID, nullable=False),
    sa.Column('number', sa.Integer(), nullable=False),
    sa.Column('status', sa.String(length=10), nullable=False),
    sa.Column('yank_reason', sa.Text(), nullable=True),
    sa.Column('yanked_at', UTC, nullable=True),
    sa.Column('digest', sa.String(length=64), nullable=False),
    sa.Column('size', sa.BigInteger(), nullable=False),
    sa.Column('method', sa.JSON(), nullable=False),
    sa.Column('quantization', sa.JSON(), nullable=False),
    sa.Column('clip', sa.JSON(), nullable=False),
    sa.Column('calibration', sa.JSON(), nullable=False),
    sa.Column('validation', sa.JSON(), nullable=True),
    sa.Column('validation_passed', sa.Boolean(), nullable=True),
    sa.Column('manifest', sa.JSON(), nullable=False),
    sa.Column('created_at', UTC, nullable=False),
    sa.Column('created_by', sa.String(length=200), nullable=True),
    sa.Column('source_job', sa.String(length=200), nullable=True),
    sa.CheckConstraint("status in ('draft', 'published', 'yanked')", name=op.f('ck_bundle_versions_status')),
    sa.ForeignKeyConstraint(['model_id'], ['models.id'], name=op.f('fk_bundle_versions_model_id_models')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_bundle_versions')),
    sa.UniqueConstraint('model_id', 'digest', name=op.f('uq_bundle_versions_model_id_digest')),
    sa.UniqueConstraint('model_id', 'number', name=op.f('uq_bundle_versions_model_id_number'))
    )
    with op.batch_alter_table('bundle_versions', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_bundle_versions_digest'), ['digest'], unique=False)
        batch_op.create_index(batch_op.f('ix_bundle_versions_model_id'), ['model_id'], unique=False)

    op.create_table('alias_events',
    sa.Column('id', ID, nullable=False),
    sa.Column('model_id', ID, nullable=False),
    sa.Column('alias', sa.String(length=64), nullable=False),
    sa.Column('from_version_id', ID, nullable=True),
    sa.Column('to_version_id', ID, nullable=True),
    sa.Column('at', UTC, nullable=False),
    sa.Column('by', sa.String(length=200), nullable=True),
    sa.Column('reason', sa.Text(), nullable=True),
    sa.ForeignKeyConstraint(['from_version_id'], ['bundle_versions.id'], name=op.f('fk_alias_events_from_version_id_bundle_versions')),
    sa.ForeignKeyConstraint(['model_id'], ['models.id'], name=op.f('fk_alias_events_model_id_models')),
    sa.ForeignKeyConstraint(['to_version_id'], ['bundle_versions.id'], name=op.f('fk_alias_events_to_version_id_bundle_versions')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_alias_events'))
    )
    with op.batch_alter_table('alias_events', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_alias_events_model_id_alias'), ['model_id', 'alias'], unique=False)

    op.create_table('aliases',
    sa.Column('id', ID, nullable=False),
    sa.Column('model_id', ID, nullable=False),
    sa.Column('name', sa.String(length=64), nullable=False),
    sa.Column('version_id', ID, nullable=False),
    sa.Column('updated_at', UTC, nullable=False),
    sa.Column('updated_by', sa.String(length=200), nullable=True),
    sa.ForeignKeyConstraint(['model_id'], ['models.id'], name=op.f('fk_aliases_model_id_models')),
    sa.ForeignKeyConstraint(['version_id'], ['bundle_versions.id'], name=op.f('fk_aliases_version_id_bundle_versions')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_aliases')),
    sa.UniqueConstraint('model_id', 'name', name=op.f('uq_aliases_model_id_name'))
    )
    op.create_table('jobs',
    sa.Column('id', sa.String(length=36), nullable=False),
    sa.Column('idempotency_key', sa.String(length=200), nullable=True),
    sa.Column('spec', sa.JSON(), nullable=False),
    sa.Column('status', sa.String(length=20), nullable=False),
    sa.Column('phase', sa.String(length=40), nullable=True),
    sa.Column('progress', sa.JSON(), nullable=False),
    sa.Column('attempts', sa.Integer(), nullable=False),
    sa.Column('max_attempts', sa.Integer(), nullable=False),
    sa.Column('lease_holder', sa.String(length=200), nullable=True),
    sa.Column('lease_expires_at', UTC, nullable=True),
    sa.Column('heartbeat_at', UTC, nullable=True),
    sa.Column('cancel_requested', sa.Boolean(), nullable=False),
    sa.Column('error', sa.Text(), nullable=True),
    sa.Column('result_version_id', ID, nullable=True),
    sa.Column('timings', sa.JSON(), nullable=False),
    sa.Column('created_at', UTC, nullable=False),
    sa.Column('updated_at', UTC, nullable=False),
    sa.Column('created_by', sa.String(length=200), nullable=True),
    sa.ForeignKeyConstraint(['result_version_id'], ['bundle_versions.id'], name=op.f('fk_jobs_result_version_id_bundle_versions')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_jobs')),
    sa.UniqueConstraint('idempotency_key', name=op.f('uq_jobs_idempotency_key'))
    )
    with op.batch_alter_table('jobs', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_jobs_status_created_at'), ['status', 'created_at'], unique=False)

    op.create_table('layer_index',
    sa.Column('id', ID, nullable=False),
    sa.Column('version_id', ID, nullable=False),
    sa.Column('layer', sa.Integer(), nullable=False),
    sa.Column('kv_head', sa.Integer(), nullable=False),
    sa.Column('side', sa.String(length=1), nullable=False),
    sa.Column('tensor_key', sa.String(length=64), nullable=False),
    sa.Column('byte_start', sa.BigInteger(), nullable=False),
    sa.Column('byte_end', sa.BigInteger(), nullable=False),
    sa.Column('clip', sa.Float(), nullable=False),
    sa.Column('eig_min', sa.Float(), nullable=True),
    sa.Column('eig_max', sa.Float(), nullable=True),
    sa.Column('eig_mean', sa.Float(), nullable=True),
    sa.ForeignKeyConstraint(['version_id'], ['bundle_versions.id'], name=op.f('fk_layer_index_version_id_bundle_versions')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_layer_index')),
    sa.UniqueConstraint('version_id', 'layer', 'kv_head', 'side', name=op.f('uq_layer_index_version_id_layer_kv_head_side'))
    )
    op.create_table('mirror_records',
    sa.Column('id', ID, nullable=False),
    sa.Column('version_id', ID, nullable=False),
    sa.Column('target', sa.String(length=20), nullable=False),
    sa.Column('repo', sa.String(length=300), nullable=False),
    sa.Column('path', sa.String(length=500), nullable=True),
    sa.Column('revision', sa.String(length=100), nullable=True),
    sa.Column('url', sa.String(length=1000), nullable=True),
    sa.Column('status', sa.String(length=20), nullable=False),
    sa.Column('error', sa.Text(), nullable=True),
    sa.Column('created_at', UTC, nullable=False),
    sa.Column('updated_at', UTC, nullable=False),
    sa.ForeignKeyConstraint(['version_id'], ['bundle_versions.id'], name=op.f('fk_mirror_records_version_id_bundle_versions')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_mirror_records')),
    sa.UniqueConstraint('version_id', 'target', 'repo', name=op.f('uq_mirror_records_version_id_target_repo'))
    )
    op.create_table('version_files',
    sa.Column('id', ID, nullable=False),
    sa.Column('version_id', ID, nullable=False),
    sa.Column('name', sa.String(length=200), nullable=False),
    sa.Column('sha256', sa.String(length=64), nullable=False),
    sa.Column('size', sa.BigInteger(), nullable=False),
    sa.ForeignKeyConstraint(['version_id'], ['bundle_versions.id'], name=op.f('fk_version_files_version_id_bundle_versions')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_version_files')),
    sa.UniqueConstraint('version_id', 'name', name=op.f('uq_version_files_version_id_name'))
    )
    with op.batch_alter_table('version_files', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_version_files_sha256'), ['sha256'], unique=False)


def downgrade() -> None:
    with op.batch_alter_table('version_files', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_version_files_sha256'))

    op.drop_table('version_files')
    op.drop_table('mirror_records')
    op.drop_table('layer_index')
    with op.batch_alter_table('jobs', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_jobs_status_created_at'))

    op.drop_table('jobs')
    op.drop_table('aliases')
    with op.batch_alter_table('alias_events', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_alias_events_model_id_alias'))

    op.drop_table('alias_events')
    with op.batch_alter_table('bundle_versions', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_bundle_versions_model_id'))
        batch_op.drop_index(batch_op.f('ix_bundle_versions_digest'))

    op.drop_table('bundle_versions')
    op.drop_table('models')
    with op.batch_alter_table('audit_log', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_audit_log_at'))

    op.drop_table('audit_log')
    op.drop_table('api_tokens')
