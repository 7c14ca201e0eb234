"""`stack up` end to end: start what is missing, wait until usable, create topics and bucket."""

from __future__ import annotations

from collections.abc import Callable

from schemas.events import ALL_TOPICS
from services.common import kafka
from services.common.objectstore import object_store
from services.common.settings import Settings, reset_settings_cache
from services.stack import health
from services.stack.launcher import Health, Stack

READY_TIMEOUT_S = 60.0


def environment_settings(base: Settings) -> Settings:
    """Settings from the environment only: what is set there is external, the rest embedded."""
    return Settings(_env_file=None, stack_dir=base.stack_dir)


def stack_up(base: Settings, log: Callable[[str], None] = print) -> dict[str, Health]:
    stack = Stack(base.stack_dir, log=log, s3_buffer_bytes=base.embedded_s3_memory_mb * 1024 * 1024)
    state = stack.up(environment_settings(base))
    reset_settings_cache()
    settings = Settings(_env_file=stack.dir / "endpoints.env")
    if state["postgres"].started_by_us:
        health.retry_until(lambda: health.postgres_create_database(settings), READY_TIMEOUT_S)
    report = health.check(settings, timeout_s=READY_TIMEOUT_S)
    failed = {name: h for name, h in report.items() if not h.ok}
    if failed:
        details = "; ".join(f"{n}: {h.detail}" for n, h in failed.items())
        raise RuntimeError(f"stack not usable ({details}); logs are in {stack.dir}")
    policy = kafka.production_topic_policy(settings, embedded_broker=state["kafka"].started_by_us)
    log(
        f"creating topics ({policy.partitions} partitions, {policy.replication_factor} "
        f"replicas, min.insync.replicas {policy.min_insync_replicas}) and bucket"
    )
    kafka.ensure_topics(kafka.admin_client(settings), ALL_TOPICS, policy)
    object_store(settings).ensure_bucket()
    from services.metadata.warehouse import upgrade

    upgrade(settings)
    return report
