"""The one row schema of privbench's results: the database tables (SQLAlchemy) and the rows a run writes.

The runner's job functions return :class:`EvaluationRow`, :class:`UtilityRow` and :class:`GuaranteeRow`; the store
validates and writes them into the tables below; report, submit path and leaderboard read these tables. The
leaderboard may import this module (it imports no plugin and no model code).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import DateTime, ForeignKey, String, Text, UniqueConstraint, false
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

__all__ = ["Base", "Evaluation", "EvaluationRow", "Guarantee", "GuaranteeRow", "Metric", "Run", "Score", "Utility",
           "UtilityRow", "RUN_STATUSES", "UTILITY_ROLES", "TABLE_NAMES"]

RUN_STATUSES = ("running", "complete", "failed")
UTILITY_ROLES = ("pretrained", "adapted", "reference")

# ---------------------------------------------------------------- schema

KEY = String(255)


class Base(DeclarativeBase):
    pass


class Run(Base):
    __tablename__ = "runs"

    id: Mapped[int] = mapped_column(primary_key=True)
    run_key: Mapped[str] = mapped_column(KEY, unique=True)
    suite: Mapped[str] = mapped_column(KEY, index=True)
    config_json: Mapped[str] = mapped_column(Text)
    config_hash: Mapped[str] = mapped_column(KEY)
    code_version: Mapped[str] = mapped_column(KEY)
    plugin_versions_json: Mapped[str] = mapped_column(Text)
    seeds_json: Mapped[str] = mapped_column(Text)
    hardware_json: Mapped[str] = mapped_column(Text)
    status: Mapped[str] = mapped_column(String(16))
    error: Mapped[str | None] = mapped_column(Text)
    started_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    duration_s: Mapped[float | None]
    submitted_by: Mapped[str | None] = mapped_column(KEY)
    verified_ci: Mapped[bool] = mapped_column(default=False, server_default=false())
    command: Mapped[str | None] = mapped_column(Text)


class Evaluation(Base):
    __tablename__ = "evaluations"
    __table_args__ = (UniqueConstraint("run_id", "eval_key", name="uq_evaluation_key"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    eval_key: Mapped[str] = mapped_column(KEY)
    task: Mapped[str] = mapped_column(KEY)
    model: Mapped[str] = mapped_column(KEY)
    defense: Mapped[str] = mapped_column(KEY)
    defense_params_json: Mapped[str] = mapped_column(Text)
    seed: Mapped[int]
    game: Mapped[str] = mapped_column(KEY)
    attack: Mapped[str] = mapped_column(KEY)
    attack_params_json: Mapped[str] = mapped_column(Text)
    world_key: Mapped[str] = mapped_column(KEY)
    duration_s: Mapped[float]
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


class Score(Base):
    __tablename__ = "scores"
    __table_args__ = (UniqueConstraint("evaluation_id", "target_id", name="uq_score_target"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    evaluation_id: Mapped[int] = mapped_column(
        ForeignKey("evaluations.id", ondelete="CASCADE"), index=True
    )
    target_id: Mapped[str] = mapped_column(KEY)
    label: Mapped[int]
    score: Mapped[float]


class Metric(Base):
    __tablename__ = "metrics"
    __table_args__ = (UniqueConstraint("evaluation_id", "metric", name="uq_metric_name"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    evaluation_id: Mapped[int] = mapped_column(ForeignKey("evaluations.id", ondelete="CASCADE"))
    metric: Mapped[str] = mapped_column(KEY)
    value: Mapped[float]
    ci_low: Mapped[float | None]
    ci_high: Mapped[float | None]
    n_pos: Mapped[int]
    n_neg: Mapped[int]
    flag: Mapped[str | None] = mapped_column(KEY)


class Utility(Base):
    __tablename__ = "utility"
    __table_args__ = (
        UniqueConstraint("run_id", "utility_key", "metric", name="uq_utility_key"),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    utility_key: Mapped[str] = mapped_column(KEY)
    task: Mapped[str] = mapped_column(KEY)
    model: Mapped[str] = mapped_column(KEY)
    defense: Mapped[str] = mapped_column(KEY)
    seed: Mapped[int]
    role: Mapped[str] = mapped_column(String(32))
    dataset: Mapped[str] = mapped_column(KEY)
    metric: Mapped[str] = mapped_column(KEY)
    value: Mapped[float]
    n_tokens: Mapped[int]


class Guarantee(Base):
    __tablename__ = "guarantees"
    __table_args__ = (
        UniqueConstraint(
            "run_id", "task", "model", "defense", "seed", "name", name="uq_guarantee_name"
        ),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    task: Mapped[str] = mapped_column(KEY)
    model: Mapped[str] = mapped_column(KEY)
    defense: Mapped[str] = mapped_column(KEY)
    seed: Mapped[int]
    name: Mapped[str] = mapped_column(KEY)
    value: Mapped[float | None]
    details_json: Mapped[str] = mapped_column(Text)


#: every table, in the order rows depend on each other
TABLE_NAMES = ("runs", "evaluations", "scores", "metrics", "utility", "guarantees")


# ------------------------------------------------------------------------------- rows a run writes
class _Row:
    """A row a job returns; ``fields()`` are the keyword arguments of the store's writer for its ``table``."""

    table: str = ""

    def fields(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class EvaluationRow(_Row):
    """One scored (world, defense, game, attack) cell: every target's label and score, and its metric rows."""

    eval_key: str
    task: str
    model: str
    defense: str
    defense_params: dict
    seed: int
    game: str
    attack: str
    attack_params: dict
    world_key: str
    target_ids: Sequence[str]
    labels: Sequence[int]
    scores: Sequence[float]
    metrics: Sequence[Any]
    duration_s: float

    table = "evaluations"


@dataclass(frozen=True)
class UtilityRow(_Row):
    """Utility values of one model on one dataset (held-out, out-of-domain, match, retained)."""

    utility_key: str
    task: str
    model: str
    defense: str
    seed: int
    role: str
    dataset: str
    values: Mapping[str, float]
    n_tokens: int

    table = "utility"


@dataclass(frozen=True)
class GuaranteeRow(_Row):
    """A formal guarantee a defense reports for its θ′ (e.g. ε of DP-SGD); ``value`` None when undefined."""

    task: str
    model: str
    defense: str
    seed: int
    name: str
    value: float | None
    details: dict = field(default_factory=dict)

    table = "guarantees"
