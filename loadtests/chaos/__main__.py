"""python -m loadtests.chaos --seed N --duration S --replicas 3 [--only 2,5] [--shrink]

Runs the schedule the seed draws against a real fleet on this machine and checks the
invariants; exits 1 when one fails, after printing the seed, the fault timeline and
the command that replays it. ``--only`` replays a subset of the schedule (fault
indexes as printed); ``--shrink`` looks for the shortest subset that still fails.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
from pathlib import Path

from .run import fault_window, report, run_in_tempdir
from .schedule import Fault, generate
from .settings import RunSettings


def _only(text: str) -> list[int]:
    if text == "none":
        return []
    try:
        return [int(part) for part in text.split(",") if part]
    except ValueError:
        raise argparse.ArgumentTypeError("--only: fault indexes separated by commas") from None


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m loadtests.chaos", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--duration", type=float, default=60.0, help="seconds (default 60)")
    parser.add_argument("--replicas", type=int, default=3)
    parser.add_argument("--rate", type=float, default=40.0, help="reviews a second")
    parser.add_argument("--only", type=_only, default=None, help="fault indexes to keep")
    parser.add_argument("--shrink", action="store_true", help="shrink a failing schedule")
    parser.add_argument(
        "--shrink-repeats", type=int, default=1, help="runs per candidate while shrinking"
    )
    parser.add_argument("--plot", type=Path, default=None, help="write a PNG here")
    parser.add_argument("--json", type=Path, default=None, help="write the results here")
    parser.add_argument("--keep", type=Path, default=None, help="run (and keep logs) here")
    args = parser.parse_args(argv)
    if args.duration < 20 or args.replicas < 1 or args.rate <= 0:
        parser.error("--duration must be at least 20, --replicas at least 1, --rate > 0")
    return args


def schedule_for(run: RunSettings, only: list[int] | None) -> list[Fault]:
    start, end = fault_window(run)
    faults = generate(run.seed, start, end, run.replicas, run.known_users)
    if only is not None:
        faults = [f for f in faults if f.index in set(only)]
    return faults


def _interrupted(signum: int, frame: object) -> None:
    # As Ctrl-C: the run's cleanup stops every gateway and redis-server it started.
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    signal.signal(signal.SIGTERM, _interrupted)
    run = RunSettings(
        seed=args.seed, duration=args.duration, replicas=args.replicas, rate=args.rate
    )
    faults = schedule_for(run, args.only)
    outcome = run_in_tempdir(run, faults, args.keep)
    print(report(outcome, args.only), flush=True)
    if args.json is not None:
        from .plot import summary

        args.json.write_text(json.dumps(summary(outcome), indent=1))
    if args.plot is not None:
        from .plot import plot

        plot(outcome, args.plot)
        print(f"plot: {args.plot}")
    if not outcome.ok and args.shrink:
        from .shrink import shrink

        smallest = shrink(run, faults, outcome.failed, args.shrink_repeats)
        print(f"\nshortest failing schedule: --only {','.join(str(f.index) for f in smallest)}")
    return 0 if outcome.ok else 1


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        print("interrupted: every process the run started was stopped", file=sys.stderr)
        sys.exit(130)
