"""The batch scheduler's pure core: LPT packing, makespan figure, ramp, staggered start."""

from __future__ import annotations

import itertools
import random

import pytest

from services.common.scheduling import Ramp, lpt_assign, makespan_ratio, start_delay_s


def loads(plan: list[list[int]], costs: list[float]) -> list[float]:
    return [sum(costs[j] for j in share) for share in plan]


def optimal_makespan(costs: list[float], workers: int) -> float:
    """Brute force over every assignment (small inputs only)."""
    best = float("inf")
    for assignment in itertools.product(range(workers), repeat=len(costs)):
        per = [0.0] * workers
        for job, w in enumerate(assignment):
            per[w] += costs[job]
        best = min(best, max(per))
    return best


def test_every_job_lands_on_exactly_one_worker_in_submission_order() -> None:
    costs = [5.0, 1.0, 3.0, 8.0, 2.0, 2.0, 7.0]
    plan = lpt_assign(costs, 3)
    assert sorted(j for share in plan for j in share) == list(range(len(costs)))
    assert all(share == sorted(share) for share in plan)
    assert len(plan) == 3


def test_lpt_places_largest_first_on_the_least_loaded_worker() -> None:
    # given jobs costing 8, 7, 5, 3, 2, 2, 1 (indexes 3, 6, 0, 2, 4, 5, 1) on 3 workers:
    # 8->w0, 7->w1, 5->w2; loads 8,7,5 -> 3->w2; 8,7,8 -> 2->w1; 8,9,8 -> 2->w0; 10,9,8 -> 1->w2
    costs = [5.0, 1.0, 3.0, 8.0, 2.0, 2.0, 7.0]
    plan = lpt_assign(costs, 3)
    assert plan == [[3, 5], [4, 6], [0, 1, 2]]
    assert loads(plan, costs) == [10.0, 9.0, 9.0]


def test_lpt_makespan_is_within_the_graham_bound_of_optimal() -> None:
    rng = random.Random(15)
    for _ in range(200):
        workers = rng.randint(2, 3)
        costs = [float(rng.randint(1, 20)) for _ in range(rng.randint(1, 7))]
        got = max(loads(lpt_assign(costs, workers), costs))
        bound = (4 / 3 - 1 / (3 * workers)) * optimal_makespan(costs, workers)
        assert got <= bound + 1e-9, (costs, workers)


def test_lpt_spreads_equal_jobs_evenly_and_drops_empty_workers() -> None:
    assert [len(s) for s in lpt_assign([1.0] * 9, 3)] == [3, 3, 3]
    assert lpt_assign([4.0, 2.0], 5) == [[0], [1]]
    assert lpt_assign([], 4) == []
    assert lpt_assign([3.0, 1.0, 2.0], 1) == [[0, 1, 2]]


def test_lpt_refuses_zero_workers() -> None:
    with pytest.raises(ValueError, match="at least one worker"):
        lpt_assign([1.0], 0)


def test_makespan_ratio_is_wall_over_the_even_spread() -> None:
    assert makespan_ratio([2.0, 2.0], 2.0) == pytest.approx(1.0)
    # one worker busy 3 s, the other 1 s: the ideal is 2 s of wall, the batch took 3 s
    assert makespan_ratio([3.0, 1.0], 3.0) == pytest.approx(1.5)
    assert makespan_ratio([1.0, 1.0, 1.0, 1.0], 4.0) == pytest.approx(4.0)


def test_makespan_ratio_of_an_idle_batch_is_perfect() -> None:
    assert makespan_ratio([], 5.0) == 1.0
    assert makespan_ratio([0.0, 0.0], 5.0) == 1.0


def test_ramp_widens_by_one_per_batch_up_to_the_maximum_and_stays() -> None:
    ramp = Ramp(4)
    assert [ramp.next_width() for _ in range(7)] == [1, 2, 3, 4, 4, 4, 4]


def test_ramp_of_one_worker_stays_at_one() -> None:
    ramp = Ramp(1)
    assert [ramp.next_width() for _ in range(3)] == [1, 1, 1]


def test_start_delay_stays_within_zero_and_the_maximum() -> None:
    rng = random.Random(1)
    delays = [start_delay_s(2.5, rng) for _ in range(10_000)]
    assert all(0.0 <= d <= 2.5 for d in delays)
    assert start_delay_s(0.0, rng) == 0.0


def test_start_delay_is_deterministic_for_a_seed() -> None:
    first = [start_delay_s(1.0, random.Random(42)) for _ in range(3)]
    assert first[0] == first[1] == first[2]
    a, b = random.Random(7), random.Random(7)
    assert [start_delay_s(1.0, a) for _ in range(50)] == [start_delay_s(1.0, b) for _ in range(50)]
    assert start_delay_s(1.0, random.Random(7)) != start_delay_s(1.0, random.Random(8))


def test_start_delay_is_uniform_over_the_window() -> None:
    # 10 equal bins of 20 000 draws: each expects 2 000 (sd ~42); a fleet bunched at one end
    # or at the maximum fails the 10 % band, and the mean sits at half the window.
    rng = random.Random(2026)
    delays = [start_delay_s(10.0, rng) for _ in range(20_000)]
    counts = [0] * 10
    for d in delays:
        counts[min(9, int(d))] += 1
    assert all(1800 <= c <= 2200 for c in counts), counts
    assert sum(delays) / len(delays) == pytest.approx(5.0, abs=0.1)


def test_start_delay_refuses_a_negative_maximum() -> None:
    with pytest.raises(ValueError, match=">= 0"):
        start_delay_s(-1.0, random.Random(0))
