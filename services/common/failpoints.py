"""Failpoints: planted bugs for fault-handling tests and `egoline bench poison`, off unless
`EGOLINE_FAILPOINTS` names them (like etcd's gofail or TiKV's fail-rs, but configured only from
settings, never from an event).

`EGOLINE_FAILPOINTS` is a comma-separated list of `<stage>.<step>=<marker>`: the named batch
step of the named stage raises `FailpointTripped` whenever the records it runs on include one
whose raw value contains `marker` (UTF-8). The step has done its work when it raises (so its
effects happened and were not published: the harshest case for idempotence). Steps: `finish`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

STEPS = frozenset({"finish"})


class FailpointTripped(RuntimeError):
    """A planted bug: raised by a step whose records include a failpoint's marker."""


@dataclass(frozen=True)
class Failpoints:
    """The failpoints of one process: marker bytes by (stage, step)."""

    markers: Mapping[tuple[str, str], bytes] = field(default_factory=dict)

    @classmethod
    def parse(cls, spec: str) -> Failpoints:
        """`shard.finish=poison-,metadata.finish=poison-` -> Failpoints; ValueError on a
        malformed entry (a typo must not silently disable a test's planted bug)."""
        markers: dict[tuple[str, str], bytes] = {}
        for entry in (e.strip() for e in spec.split(",")):
            if not entry:
                continue
            where, sep, marker = entry.partition("=")
            stage, dot, step = where.strip().partition(".")
            if not sep or not dot or not stage or step not in STEPS or not marker:
                raise ValueError(
                    f"failpoint {entry!r}: expected <stage>.<step>=<marker>, "
                    f"step in {sorted(STEPS)}"
                )
            markers[(stage, step)] = marker.encode()
        return cls(markers)

    def check(self, stage: str, step: str, values: Iterable[bytes]) -> None:
        """Raise `FailpointTripped` if a failpoint is set for (stage, step) and one of
        `values` contains its marker."""
        marker = self.markers.get((stage, step))
        if marker is None:
            return
        for value in values:
            if marker in value:
                raise FailpointTripped(f"failpoint {stage}.{step} tripped by a planted record")
