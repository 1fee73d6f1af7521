"""The shortest schedule that still fails: delta debugging over the fault list.

Zeller's ddmin: split the faults into n chunks; keep a chunk, or the complement of one,
that still fails; otherwise split finer. Each candidate is a whole run with the same
seed (the same load, each kept fault at its own time), so a candidate takes the run's
duration; a schedule of k faults takes O(k log k) runs, usually 10-30. It "still fails"
when one of the invariants the original run broke breaks again. A failure that depends
on timing may not show on every run: ``repeats`` runs a candidate up to that many
times, failing if any of them does.

    python -m loadtests.chaos --seed 7 --duration 60 --shrink
"""

from __future__ import annotations

from collections.abc import Callable

from .run import report, run_in_tempdir
from .schedule import Fault
from .settings import RunSettings


def ddmin(faults: list[Fault], fails: Callable[[list[Fault]], bool]) -> list[Fault]:
    """A 1-minimal failing subset of ``faults`` (which must fail): removing any one fault
    of the result makes it pass."""
    n = 2
    while len(faults) >= 2:
        size = -(-len(faults) // n)
        chunks = [faults[i : i + size] for i in range(0, len(faults), size)]
        for chunk in chunks:
            if fails(chunk):
                faults, n = chunk, 2
                break
        else:
            for i in range(len(chunks)):
                rest = [f for j, c in enumerate(chunks) if j != i for f in c]
                if len(chunks) > 2 and fails(rest):
                    faults, n = rest, max(n - 1, 2)
                    break
            else:
                if n >= len(faults):
                    break
                n = min(len(faults), 2 * n)
    return faults


def shrink(
    run: RunSettings, faults: list[Fault], broken: list[str], repeats: int = 1
) -> list[Fault]:
    """The shortest subset of ``faults`` that breaks one of the ``broken`` invariants."""

    def fails(candidate: list[Fault]) -> bool:
        only = [f.index for f in candidate]
        for attempt in range(repeats):
            outcome = run_in_tempdir(run, candidate)
            again = set(outcome.failed) & set(broken)
            print(
                f"shrink: {len(candidate)} faults {only} (run {attempt + 1}): "
                f"{'fails' if again else 'passes'}",
                flush=True,
            )
            if again:
                print(report(outcome, only), flush=True)
                return True
        return False

    return ddmin(list(faults), fails)
