"""Hypothesis explores schedules of the simulated network (see ``tests/simulation.py``).

CI runs ``FIBERFLOW_SIMULATION_EXAMPLES`` examples (default 40); the long campaign is
``python -m tests.campaign``. A failure prints the one command that replays it.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, given, settings

from tests.simulation import Schedule, run_schedule, schedule_from_seed, schedules

EXAMPLES = int(os.environ.get("FIBERFLOW_SIMULATION_EXAMPLES", "40"))


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    print_blob=True,
)
@given(schedules())
def test_every_schedule_keeps_the_invariants(schedule: Schedule) -> None:
    run_schedule(schedule)


def test_seeded_schedules_keep_the_invariants() -> None:
    for seed in range(20):
        run_schedule(schedule_from_seed(seed))


def test_a_schedule_round_trips_through_json() -> None:
    schedule = schedule_from_seed(7)
    assert Schedule.from_json(schedule.to_json()) == schedule


def test_seeded_schedules_exercise_crashes_faults_and_every_flow_kind() -> None:
    kinds, crashes, faulty = set(), 0, 0
    for seed in range(40):
        schedule = schedule_from_seed(seed)
        kinds |= {flow.kind for flow in schedule.flows}
        report = run_schedule(schedule)
        crashes += report.crashes + report.restarts
        faulty += any((schedule.drop, schedule.duplicate, schedule.delay, schedule.reorder))
    assert kinds == {"ping", "payment", "trade", "quotes", "sleep"}
    assert crashes > 20 and faulty > 10
