"""Baseline: the schema privbench 0.2.0 shipped before its schema was versioned.

Databases written before versioning have these six tables and no ``alembic_version`` table;
`privbench db upgrade` stamps them at this revision (bench/migrate.py) and upgrades from here.

Revision ID: 0001_baseline
Revises: (none)
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0001_baseline'
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('runs',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('run_key', sa.String(length=255), nullable=False),
    sa.Column('suite', sa.String(length=255), nullable=False),
    sa.Column('config_json', sa.Text(), nullable=False),
    sa.Column('config_hash', sa.String(length=255), nullable=False),
    sa.Column('code_version', sa.String(length=255), nullable=False),
    sa.Column('plugin_versions_json', sa.Text(), nullable=False),
    sa.Column('seeds_json', sa.Text(), nullable=False),
    sa.Column('hardware_json', sa.Text(), nullable=False),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('error', sa.Text(), nullable=True),
    sa.Column('started_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('finished_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('duration_s', sa.Double(), nullable=True),
    sa.Column('submitted_by', sa.String(length=255), nullable=True),
    sa.Column('verified_ci', sa.Boolean(), server_default=sa.false(), nullable=False),
    sa.Column('command', sa.Text(), nullable=True),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('run_key')
    )
    op.create_index('ix_runs_suite', 'runs', ['suite'], unique=False)

    op.create_table('evaluations',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('run_id', sa.Integer(), nullable=False),
    sa.Column('eval_key', sa.String(length=255), nullable=False),
    sa.Column('task', sa.String(length=255), nullable=False),
    sa.Column('model', sa.String(length=255), nullable=False),
    sa.Column('defense', sa.String(length=255), nullable=False),
    sa.Column('defense_params_json', sa.Text(), nullable=False),
    sa.Column('seed', sa.Integer(), nullable=False),
    sa.Column('game', sa.String(length=255), nullable=False),
    sa.Column('attack', sa.String(length=255), nullable=False),
    sa.Column('attack_params_json', sa.Text(), nullable=False),
    sa.Column('world_key', sa.String(length=255), nullable=False),
    sa.Column('duration_s', sa.Double(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['run_id'], ['runs.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('run_id', 'eval_key', name='uq_evaluation_key')
    )
    op.create_table('guarantees',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('run_id', sa.Integer(), nullable=False),
    sa.Column('task', sa.String(length=255), nullable=False),
    sa.Column('model', sa.String(length=255), nullable=False),
    sa.Column('defense', sa.String(length=255), nullable=False),
    sa.Column('seed', sa.Integer(), nullable=False),
    sa.Column('name', sa.String(length=255), nullable=False),
    sa.Column('value', sa.Double(), nullable=True),
    sa.Column('details_json', sa.Text(), nullable=False),
    sa.ForeignKeyConstraint(['run_id'], ['runs.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('run_id', 'task', 'model', 'defense', 'seed', 'name', name='uq_guarantee_name')
    )
    op.create_table('utility',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('run_id', sa.Integer(), nullable=False),
    sa.Column('utility_key', sa.String(length=255), nullable=False),
    sa.Column('task', sa.String(length=255), nullable=False),
    sa.Column('model', sa.String(length=255), nullable=False),
    sa.Column('defense', sa.String(length=255), nullable=False),
    sa.Column('seed', sa.Integer(), nullable=False),
    sa.Column('role', sa.String(length=32), nullable=False),
    sa.Column('dataset', sa.String(length=255), nullable=False),
    sa.Column('metric', sa.String(length=255), nullable=False),
    sa.Column('value', sa.Double(), nullable=False),
    sa.Column('n_tokens', sa.Integer(), nullable=False),
    sa.ForeignKeyConstraint(['run_id'], ['runs.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('run_id', 'utility_key', 'metric', name='uq_utility_key')
    )
    op.create_table('metrics',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('evaluation_id', sa.Integer(), nullable=False),
    sa.Column('metric', sa.String(length=255), nullable=False),
    sa.Column('value', sa.Double(), nullable=False),
    sa.Column('ci_low', sa.Double(), nullable=True),
    sa.Column('ci_high', sa.Double(), nullable=True),
    sa.Column('n_pos', sa.Integer(), nullable=False),
    sa.Column('n_neg', sa.Integer(), nullable=False),
    sa.Column('flag', sa.String(length=255), nullable=True),
    sa.ForeignKeyConstraint(['evaluation_id'], ['evaluations.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('evaluation_id', 'metric', name='uq_metric_name')
    )
    op.create_table('scores',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('evaluation_id', sa.Integer(), nullable=False),
    sa.Column('target_id', sa.String(length=255), nullable=False),
    sa.Column('label', sa.Integer(), nullable=False),
    sa.Column('score', sa.Double(), nullable=False),
    sa.ForeignKeyConstraint(['evaluation_id'], ['evaluations.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('evaluation_id', 'target_id', name='uq_score_target')
    )
    op.create_index('ix_scores_evaluation_id', 'scores', ['evaluation_id'], unique=False)



def downgrade() -> None:
    op.drop_index('ix_scores_evaluation_id', table_name='scores')

    op.drop_table('scores')
    op.drop_table('metrics')
    op.drop_table('utility')
    op.drop_table('guarantees')
    op.drop_table('evaluations')
    op.drop_index('ix_runs_suite', table_name='runs')

    op.drop_table('runs')
