"""A long simulation campaign: many seeded schedules, each checked against the invariants.

    python -m tests.campaign --schedules 10000 [--first-seed 0]   # a campaign
    python -m tests.campaign --seed 1234                          # replay one seed
    python -m tests.campaign --replay '<schedule json>'           # replay a hypothesis find
    python -m tests.campaign --hibernate ...   # every waiting flow hibernates in every schedule

Prints progress, the totals (schedules, flows, rounds, crashes, restarts) and, for a failure,
the seed and the command that replays it; exits non-zero if any schedule failed.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time

import attrs

from flows.cli.progress import ProgressBar
from tests.simulation import InvariantViolation, Schedule, run_schedule, schedule_from_seed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--schedules", type=int, default=1000)
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--seed", type=int, help="replay one seed")
    parser.add_argument("--replay", help="replay a schedule given as JSON")
    parser.add_argument("--stop-at-first", action="store_true")
    parser.add_argument(
        "--hibernate",
        action="store_true",
        help="hibernate every waiting flow as soon as it suspends, in every schedule",
    )
    args = parser.parse_args()
    logging.disable(logging.WARNING)  # dead-lettered duplicates are expected and noisy
    if args.replay or args.seed is not None:
        schedule = Schedule.from_json(args.replay) if args.replay else schedule_from_seed(args.seed)
        if args.hibernate:
            schedule = attrs.evolve(schedule, hibernate=True)
        print(schedule.describe())
        report = run_schedule(schedule)
        print(f"ok: {report}")
        return 0
    seeds = range(args.first_seed, args.first_seed + args.schedules)
    bar = ProgressBar(len(seeds), "schedules")
    totals = {"flows": 0, "rounds": 0, "crashes": 0, "restarts": 0}
    failures: list[int] = []
    began = time.perf_counter()
    for done, seed in enumerate(seeds, start=1):
        try:
            schedule = schedule_from_seed(seed)
            if args.hibernate:
                schedule = attrs.evolve(schedule, hibernate=True)
            report = run_schedule(schedule)
        except InvariantViolation as error:
            failures.append(seed)
            again = f"python -m tests.campaign --seed {seed}" + (" --hibernate" * args.hibernate)
            print(f"\nseed {seed} FAILED: {error}\nreplay: {again}")
            if args.stop_at_first:
                break
        else:
            for key in totals:
                totals[key] += getattr(report, key)
        bar.update(done)
    bar.finish()
    elapsed = time.perf_counter() - began
    ran = done
    print(
        f"{ran} schedules (seeds {seeds.start}..{seeds.start + ran - 1}) in {elapsed:.1f} s: "
        f"{totals['flows']} flows, {totals['rounds']} scheduled steps and rounds, "
        f"{totals['crashes']} crashes at armed points, {totals['restarts']} forced restarts; "
        f"{len(failures)} failed{': ' + str(failures[:20]) if failures else ''}"
    )
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
