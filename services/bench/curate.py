"""`egoline bench curate`: content signals and duplicates, scored against labelled media.

1. A labelled mix (`synth.realistic.curation_cases`: clean recordings of varied make plus blur,
   over/under-exposure, frozen segments, covered lens, a device at rest, re-encoded and
   trimmed duplicates) is encoded the way devices do (encoder defaults), two processes at once.
2. The device agent uploads it to a fleet of its own; each episode is awaited in the warehouse.
3. Each episode's predicted classes come from the warehouse alone (its clips' quality values,
   its duplicate mark) through the pipeline's own decision (`media.content.content_classes`,
   the one validate's reject mode applies) with the `EGOLINE_CURATION_*` thresholds
   (`predict`); against `labels.json` that gives precision and recall per class.
4. `extra_cpu_fraction`: the validate stage's own function (`validate_episode`: fetch, keyframe
   decode, rules) run in this process on a sample of the mix with signals off and on,
   alternating, CPU seconds compared (the same work but the signals).
5. Near-duplicate lookup at 1M episodes: `bench.near_dup` seeds signatures and times lookups;
   the IMU signature's at 100k: `bench.imu_dup`.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from multiprocessing import get_context
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, select

from schemas.events import ClipQuality, EpisodeUploaded
from services.common.objectstore import ObjectStore
from services.common.settings import Settings
from services.media.content import ContentThresholds, EpisodeContent, content_classes
from services.metadata.warehouse import clips, manifest_episodes
from services.synth.realistic import RealisticCase, curation_cases, with_originals, write_case

CLASSES = ("blur", "overexposed", "underexposed", "frozen", "covered", "static", "duplicate")


@dataclass(frozen=True)
class EpisodeFacts:
    """An episode as the warehouse knows it: its clips' worst values and its duplicate mark."""

    episode_id: str
    content: EpisodeContent
    duplicate_of: str | None


def predict(facts: EpisodeFacts, th: ContentThresholds) -> set[str]:
    """The classes of an episode: its content classes by the pipeline's own decision
    (`services.media.content.content_classes`, the one validate's reject mode applies) and
    `duplicate` when the warehouse marked it a duplicate."""
    out = {c.value for c in content_classes(facts.content, th)}
    if facts.duplicate_of is not None:
        out.add("duplicate")
    return out


def truth_of(label: Mapping[str, Any]) -> set[str]:
    content = str(label["content"])
    if label.get("duplicate_of"):
        return {"duplicate"}
    return set() if content == "clean" else {content}


def score(
    truth: Mapping[str, set[str]], predicted: Mapping[str, set[str]]
) -> dict[str, dict[str, float | int]]:
    """Per class: precision, recall and the counts behind them (support: labelled episodes)."""
    out: dict[str, dict[str, float | int]] = {}
    for cls in CLASSES:
        tp = sum(1 for e, t in truth.items() if cls in t and cls in predicted.get(e, set()))
        fp = sum(1 for e, t in truth.items() if cls not in t and cls in predicted.get(e, set()))
        fn = sum(1 for e, t in truth.items() if cls in t and cls not in predicted.get(e, set()))
        out[cls] = {
            "precision": round(tp / (tp + fp), 3) if tp + fp else 1.0,
            "recall": round(tp / (tp + fn), 3) if tp + fn else 1.0,
            "support": tp + fn,
            "false_positives": fp,
        }
    return out


def _write(job: tuple[RealisticCase, Path, int, RealisticCase | None]) -> Path:
    case, out_dir, seed, original = job
    return write_case(case, out_dir, seed, original)


def write_mix(
    count: int, seed: int, out_dir: Path, jobs: int, log: Callable[[str], None]
) -> list[Path]:
    """The labelled mix, encoded `jobs` at a time (originals before their duplicates)."""
    cases = curation_cases(count, seed)
    pairs = list(with_originals(cases, None))
    first = [(c, out_dir, seed, o) for c, o in pairs if o is None]
    then = [(c, out_dir, seed, o) for c, o in pairs if o is not None]
    started = time.perf_counter()
    dirs: list[Path] = []
    # spawn: the bench process may hold librdkafka threads already (no fork after them)
    with ProcessPoolExecutor(max_workers=jobs, mp_context=get_context("spawn")) as pool:
        for batch in (first, then):
            for done, path in enumerate(pool.map(_write, batch), start=len(dirs) + 1):
                dirs.append(path)
                if done % 20 == 0 or done == len(pairs):
                    log(f"encoded {done}/{len(pairs)} ({time.perf_counter() - started:.0f} s)")
    return dirs


def labels(dirs: Iterable[Path]) -> dict[str, dict[str, Any]]:
    out = {}
    for d in dirs:
        label = json.loads((d / "labels.json").read_text())
        out[str(label["episode_id"])] = label
    return out


def signal_overhead(
    store: ObjectStore, uploaded: list[EpisodeUploaded], pipeline_version: str, rounds: int = 5
) -> dict[str, float]:
    """CPU seconds of the validate stage's function on these episodes with signals off and on:
    after one warm-up pass, `rounds` alternating passes of each, the fastest pass of each mode
    compared (the object store's HTTP client and the page cache make single passes noisy)."""
    from services.common.rawcache import fetch_raw
    from services.decode.app import decode_episode
    from services.validate.app import validate_episode
    from services.validate.rules import RuleSet

    def fetch(key: str, dest: Path) -> None:
        fetch_raw(store, None, key, dest)

    decoded = [decode_episode(store, u, pipeline_version, fetch) for u in uploaded]
    on, off = RuleSet(signal_sample_s=1.0), RuleSet(signal_sample_s=None)
    for d in decoded:  # warm-up: page cache, codec init
        validate_episode(fetch, d, on)
    passes: dict[str, list[float]] = {"on": [], "off": []}
    for _ in range(rounds):
        for name, rules in (("off", off), ("on", on)):
            started = time.process_time()
            for d in decoded:
                validate_episode(fetch, d, rules)
            passes[name].append(time.process_time() - started)
    best_off, best_on = min(passes["off"]), min(passes["on"])
    return {
        "validate_cpu_s_without_signals": round(best_off, 3),
        "validate_cpu_s_with_signals": round(best_on, 3),
        "extra_cpu_fraction": round((best_on - best_off) / max(best_off, 1e-9), 4),
    }


def episode_facts(engine: Engine, ids: list[str], pipeline_version: str) -> dict[str, EpisodeFacts]:
    """Each episode's clips' values (from `clips`, summarised by `EpisodeContent.of_clips`) and
    duplicate mark (from `manifest_episodes`): what the manifest filters see."""
    c = clips.c
    rows = select(
        c.episode_id,
        c.sharpness,
        c.mean_luma,
        c.highlights,
        c.shadows,
        c.frozen_fraction,
        c.blocked_fraction,
        c.motion,
    ).where(c.episode_id.in_(ids), c.pipeline_version == pipeline_version)
    marks = select(manifest_episodes.c.episode_id, manifest_episodes.c.duplicate_of).where(
        manifest_episodes.c.episode_id.in_(ids),
        manifest_episodes.c.pipeline_version == pipeline_version,
    )
    with engine.connect() as conn:
        duplicate_of = {str(e): d for e, d in conn.execute(marks)}
        per_episode: dict[str, list[ClipQuality]] = {}
        for e, sharp, luma, high, low, frozen, blocked, motion in conn.execute(rows):
            per_episode.setdefault(str(e), []).append(
                ClipQuality(
                    sharpness=sharp,
                    mean_luma=luma,
                    highlights=high,
                    shadows=low,
                    frozen_fraction=frozen or 0.0,
                    blocked_fraction=blocked or 0.0,
                    motion=motion,
                )
            )
    return {
        e: EpisodeFacts(
            episode_id=e,
            content=EpisodeContent.of_clips(qualities),
            duplicate_of=None if duplicate_of.get(e) is None else str(duplicate_of[e]),
        )
        for e, qualities in per_episode.items()
    }


def bench_curate(
    settings: Settings,
    episodes: int,
    seed: int,
    log: Callable[[str], None],
    lookup_episodes: int = 1_000_000,
    overhead_sample: int = 24,
    hd_episodes: int = 8,
    imu_lookup_episodes: int = 100_000,
) -> dict[str, Any]:
    """`egoline bench curate`: the mix through a fleet of its own, scored; the CPU share of the
    signals in validate; near-duplicate lookups at `lookup_episodes` (pHash) and
    `imu_lookup_episodes` (IMU signature; 0: skipped)."""
    from services.agent.runner import make_agent
    from services.bench.chaos import statuses
    from services.bench.imu_dup import imu_dup_lookup_bench
    from services.bench.near_dup import near_dup_lookup_bench
    from services.common.objectstore import object_store
    from services.metadata.core import TERMINAL
    from services.metadata.warehouse import make_engine
    from services.stack.fleet import Fleet

    if seed < 0:  # fresh episode ids each run
        seed = int(time.time()) % 9000 + 1000
    work = settings.stack_dir / "bench-curate"
    shutil.rmtree(work, ignore_errors=True)
    started = time.perf_counter()
    dirs = write_mix(episodes, seed, work / "episodes", jobs=2, log=log)
    # Clean 720p recordings beside the mix (the mix is 320x240, to encode fast): the
    # validate CPU the signals add is measured on these, as devices record.
    hd = [
        write_case(
            RealisticCase(
                f"hd_{i:02d}",
                seed_offset=9000 + 17 * i,  # each its own recording
                codec=("h264", "h265")[i % 2],
                duration_s=10.0,
                width=1280,
                height=720,
            ),
            work / "episodes",
            seed,
        )
        for i in range(hd_episodes)
    ]
    dirs += hd
    encode_s = time.perf_counter() - started
    truth_labels = labels(dirs)
    ids = sorted(truth_labels)
    engine = make_engine(settings)
    store = object_store(settings)
    fleet = Fleet(work / "logs", env={"EGOLINE_START_JITTER_S": "0", "EGOLINE_BATCH_WAIT_S": "0.5"})
    fleet.start_all()
    try:
        if statuses(engine, ids):
            raise RuntimeError(f"seed {seed}: these episodes are already in the warehouse")
        fleet.wait_ready()
        agent = make_agent(settings.for_agent(work / "agent"), store)
        pipeline_started = time.perf_counter()
        counts = agent.run_once(dirs, 600.0)
        log(f"uploaded: {counts}")
        deadline = time.monotonic() + 1800
        while True:
            state = statuses(engine, ids)
            done = sum(1 for s in state.values() if s in TERMINAL)
            log(f"in the warehouse: {done}/{len(ids)} terminal")
            if done == len(ids) or time.monotonic() > deadline:
                break
            time.sleep(5)
        pipeline_s = time.perf_counter() - pipeline_started
    finally:
        fleet.stop()
    facts = episode_facts(engine, ids, settings.pipeline_version)
    thresholds = ContentThresholds.of(settings.curation)
    predicted = {e: predict(f, thresholds) for e, f in facts.items()}
    truth = {e: truth_of(label) for e, label in truth_labels.items()}
    scores = score(truth, predicted)
    wrong = {
        e: {"truth": sorted(truth[e]), "predicted": sorted(predicted.get(e, set()))}
        for e in ids
        if truth[e] != predicted.get(e, set())
    }
    log(f"classes: {json.dumps(scores)}")
    log(f"misclassified: {json.dumps(wrong)}")
    log("validate CPU with signals off and on (fleet stopped)")
    announced = [
        EpisodeUploaded.model_validate_json(row.event_json)
        for row in agent.journal.episodes()
        if row.event_json
    ]
    hd_ids = {d.name for d in hd}
    overhead = signal_overhead(
        store, [u for u in announced if u.episode.episode_id in hd_ids], settings.pipeline_version
    )
    mix = [u for u in announced if u.episode.episode_id not in hd_ids][:overhead_sample]
    overhead_mix = signal_overhead(store, mix, settings.pipeline_version)
    log(f"signals in validate: 720p {json.dumps(overhead)}, mix {json.dumps(overhead_mix)}")
    log(f"near-duplicate lookups at {lookup_episodes} seeded episodes")
    lookup = near_dup_lookup_bench(settings, episodes=lookup_episodes)["near_dup_lookup"]
    engine.dispose()
    if not isinstance(lookup, dict):
        raise TypeError("near_dup_lookup_bench returned no figures")
    imu_lookup: dict[str, Any] = {}
    if imu_lookup_episodes:
        log(f"IMU near-duplicate lookups at {imu_lookup_episodes} seeded episodes")
        figures = imu_dup_lookup_bench(settings, episodes=imu_lookup_episodes)["imu_dup_lookup"]
        if not isinstance(figures, dict):
            raise TypeError("imu_dup_lookup_bench returned no figures")
        imu_lookup = figures
    return {
        "episodes": len(ids),
        "cataloged": sum(1 for s in state.values() if s in TERMINAL),
        "sharded": len(facts),
        "classes": scores,
        "min_precision": min(float(v["precision"]) for v in scores.values()),
        "min_recall": min(float(v["recall"]) for v in scores.values()),
        **overhead,
        "extra_cpu_fraction_at": "1280x720 h264/h265, encoder defaults",
        "extra_cpu_fraction_mix_320x240": overhead_mix["extra_cpu_fraction"],
        "near_dup_lookup_episodes": lookup_episodes,
        "near_dup_lookup_p50_ms": lookup.get("p50_ms"),
        "near_dup_lookup_p99_ms": lookup.get("p99_ms"),
        "near_dup_lookup": lookup,
        "imu_dup_lookup_episodes": imu_lookup_episodes,
        "imu_dup_lookup_p50_ms": imu_lookup.get("p50_ms"),
        "imu_dup_lookup_p99_ms": imu_lookup.get("p99_ms"),
        "imu_dup_lookup": imu_lookup,
        "misclassified": wrong,
        "encode_s": round(encode_s, 1),
        "pipeline_s": round(pipeline_s, 1),
        "seed": seed,
    }
