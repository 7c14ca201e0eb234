"""The held-out rules of a manifest family (pure: plain data in, violations out).

A *family* is the successive versions of one dataset (a name given at `manifest build
--family` or `manifest index --family`, stored with the manifest's index row). For a manifest
M of family F, grouping episodes by the split key (session or device, `EGOLINE_SPLIT_KEY`):

- **no leak**: no group that M puts in eval is in a train split of any manifest of F (M
  included), and no group M puts in train is in an eval split of any manifest of F;
- **eval only grows**: every episode in the eval split of a manifest of F built before M is in
  M's eval split.

docs/warehouse.md "Held-out integrity" says why both, and what the check reads.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

EVAL = "eval"
TRAIN = "train"


@dataclass(frozen=True)
class GroupUse:
    """The manifests that hold episodes of one group under one split."""

    group: str
    split: str
    manifests: tuple[str, ...]


@dataclass(frozen=True)
class Leak:
    """A group in eval somewhere and in train somewhere (M on one of the two sides)."""

    group: str
    eval_in: tuple[str, ...]
    train_in: tuple[str, ...]


@dataclass(frozen=True)
class EarlierEval:
    """An episode in the eval split of earlier manifests of the family."""

    episode_id: str
    group: str
    manifests: tuple[str, ...]


@dataclass(frozen=True)
class DroppedEval:
    """An episode an earlier manifest held out that M does not hold out."""

    episode_id: str
    group: str
    eval_in: tuple[str, ...]


def find_leaks(target: str, uses: Iterable[GroupUse]) -> list[Leak]:
    """Groups held in eval and in train where `target` is on one side, sorted by group."""
    eval_in: dict[str, set[str]] = {}
    train_in: dict[str, set[str]] = {}
    for use in uses:
        if use.split == EVAL:
            eval_in.setdefault(use.group, set()).update(use.manifests)
        elif use.split == TRAIN:
            train_in.setdefault(use.group, set()).update(use.manifests)
    leaks = []
    for group in sorted(set(eval_in) & set(train_in)):
        evals, trains = eval_in[group], train_in[group]
        if target in evals or target in trains:
            leaks.append(Leak(group, tuple(sorted(evals)), tuple(sorted(trains))))
    return leaks


def find_dropped_eval(
    target_eval: set[str], earlier_eval: Iterable[EarlierEval]
) -> list[DroppedEval]:
    """Earlier eval episodes missing from `target_eval` (M's eval episode ids), sorted."""
    dropped = [
        DroppedEval(e.episode_id, e.group, tuple(sorted(e.manifests)))
        for e in earlier_eval
        if e.episode_id not in target_eval
    ]
    return sorted(dropped, key=lambda d: d.episode_id)
