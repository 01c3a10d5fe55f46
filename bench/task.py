"""Task contract: a task builds the data partitions that one world is drawn from."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from bench.errors import PluginError
from bench.plugin import Plugin, plugin_code


@dataclass(frozen=True)
class TargetRecord:
    """A candidate target: the challenger decides whether it goes into S, D, both or neither."""

    id: str
    text: str


@dataclass(frozen=True)
class TaskData:
    """Disjoint partitions of one task. Only the challenger sees all of them."""

    name: str
    pretrain: tuple[str, ...]          # pretraining corpus S (before targets are inserted)
    heldout: tuple[str, ...]           # same distribution, never trained on: utility evaluation
    population: tuple[str, ...]        # attacker-owned data from the same distribution
    adapt: tuple[str, ...]             # adaptation data D (before targets are inserted)
    targets: tuple[TargetRecord, ...]  # pool the challenger draws targets from
    fingerprint: str
    sources: tuple[dict[str, Any], ...] = field(default_factory=tuple)
    stats: dict[str, Any] = field(default_factory=dict)
    #: relation of the target/adaptation pools to the pretraining corpus: "overlap", "iid" or "ood"
    relation: str = "iid"
    #: membership unit: "record", "user" (all records of a user) or "secret" (all records carrying it)
    unit: str = "record"
    #: challenger-only facts per target id (canary secret, user id, ...); never given to an attack
    target_meta: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: what an attacker legitimately knows about how targets are built (e.g. a canary format), given to attacks
    public_format: dict[str, Any] | None = None
    #: owner (user id) of each ``adapt`` record, aligned with it, for user-stratified tasks; challenger-only
    adapt_owners: tuple[str, ...] | None = None
    #: owner of each ``population`` record, aligned with it, for user-stratified tasks: what an attacker knows of
    #: its own data when it trains shadow models of a recipe that reads owners (per-user limits)
    population_owners: tuple[str, ...] | None = None
    #: every secret the task inserted (secret-bearing tasks), target and non-target alike: secret string ->
    #: {"secret_id", "p", "r", "n_records", "kind", "partition"}. Challenger-only: the defender gets the entries of
    #: the secrets in its own texts (bench.units.defender_secrets), the attacker only the target secrets'
    #: public spec (public_format["secrets"])
    secret_spec: dict[str, dict[str, Any]] | None = None
    #: document of each ``adapt`` and ``targets`` record, aligned with them, for tasks of natural text chunked from
    #: documents; with both, a world draws targets and background from one pool split by document under its secret
    #: (bench.pools). Challenger-only
    adapt_docs: tuple[str, ...] | None = None
    target_docs: tuple[str, ...] | None = None


class Task(Plugin):
    """A data task. Besides :meth:`build` it declares what ``privbench data`` shows about it before building, so no
    table outside the task has to know it."""

    kind: ClassVar[str] = "task"
    #: True when the task knows which targets a released model was pretrained on (e.g. MIMIR for Pythia)
    known_pretraining_membership: ClassVar[bool] = False
    #: True when the task builds offline with its defaults (then `privbench data build --all` builds it)
    offline: ClassVar[bool] = False
    #: the parameter a split name's ``task:<variant>`` sets (``pile_subset:wiki``), whose choices are the variants
    variant_param: ClassVar[str | None] = None
    #: what one record is, formatted with the task's parameters (e.g. "text chunk <= {record_chars} chars")
    record_unit: ClassVar[str] = "record"
    #: licenses of what the task generates itself, beyond its sources' (e.g. synthetic names)
    extra_licenses: ClassVar[tuple[str, ...]] = ()
    #: what a build needs that does not install with pip (a hub connection, a local file), or None
    needs: ClassVar[str | None] = None

    def build(self, cache=None) -> TaskData:  # pragma: no cover - interface
        raise NotImplementedError

    def relation_label(self) -> str:
        """Relation of the adaptation and target pools to pretraining as known before building ("?": unknown)."""
        return "?"

    def provenance(self) -> list[dict[str, Any]]:
        """Provenance and license of every text source the task reads, before building (empty when unknown)."""
        return []


def built_task_data(task: Task, cache: Any) -> TaskData:
    """``task.build(cache)`` as plugin code: a crash, or anything but :class:`TaskData`, fails with the task's name."""
    with plugin_code(task, "build"):
        data = task.build(cache)
    if not isinstance(data, TaskData):
        raise PluginError(f"task '{task.name}': build returned {type(data).__name__}: return bench.task.TaskData "
                          f"with the task's partitions")
    return data
