"""Compare the two maintained CEL libraries on the jwt backend's kind of expression.

cel-python (``celpy``, pure Python) against the ``common-expression-language``
bindings (``cel``, Rust). Each expression is compiled once, as the backend does at
config load, then evaluated over one token's claims; the figures are per evaluation.
Run: ``python -m loadtests.cel_compare``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

CLAIMS: dict[str, Any] = {
    "iss": "https://issuer.example",
    "sub": "1234",
    "email": "jane@example.com",
    "email_verified": True,
    "groups": ["dev", "ops", "admins"],
    "exp": 2_000_000_000,
    "hd": "example.com",
}

EXPRESSIONS = [
    "claims.email_verified == true",
    "'system:' + claims.sub",
    "claims.groups.map(g, 'oidc:' + g)",
    "claims.hd == 'example.com' && claims.groups.exists(g, g == 'dev')",
    "has(claims.hd) ? [claims.hd] : []",
]


def _per_call(fn: Callable[[], object], seconds: float = 0.5) -> float:
    n, started = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - started) < seconds:
        for _ in range(100):
            fn()
        n += 100
    return elapsed / n


def measure_celpy() -> tuple[float, float]:
    import celpy

    env = celpy.Environment()
    started = time.perf_counter()
    programs = [env.program(env.compile(e)) for e in EXPRESSIONS]
    compile_s = (time.perf_counter() - started) / len(EXPRESSIONS)
    activation = {"claims": celpy.json_to_cel(CLAIMS)}
    return compile_s, sum(_per_call(lambda p=p: p.evaluate(activation)) for p in programs) / len(
        programs
    )


def measure_cel_rs() -> tuple[float, float]:
    import cel

    started = time.perf_counter()
    programs = [cel.compile(e) for e in EXPRESSIONS]
    compile_s = (time.perf_counter() - started) / len(EXPRESSIONS)
    context = {"claims": CLAIMS}
    return compile_s, sum(_per_call(lambda p=p: p.execute(context)) for p in programs) / len(
        programs
    )


def main() -> None:
    rows = [("cel-python 0.5", *measure_celpy()), ("common-expression-language", *measure_cel_rs())]
    print(f"{'library':30} {'compile (us)':>14} {'evaluate (us)':>14}")
    for name, comp, ev in rows:
        print(f"{name:30} {comp * 1e6:14.1f} {ev * 1e6:14.1f}")
    print(f"evaluate ratio cel-python / bindings: {rows[0][2] / rows[1][2]:.1f}x")


if __name__ == "__main__":
    main()
