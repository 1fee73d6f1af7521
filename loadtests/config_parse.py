"""What reading a config file costs, by YAML loader: the largest file the gateway takes
(safe_yaml.MAX_BYTES, 1 MiB) with each loader, in alternating rounds.

- ``python``: safe_yaml.SafeConfigLoader, PyYAML's scanner and parser in Python under
  the checks (the reference: what every file went through before);
- ``libyaml``: safe_yaml.FastConfigLoader, libyaml's scanner and parser (CParser)
  under the same Composer, constructor and checks (what :func:`safe_yaml.load` uses);
- ``CSafeLoader``: PyYAML's own C loader, with none of the checks (no depth bound before
  composing, no alias bound, duplicate keys kept): the floor, for scale.

The file is a static backend with inline tokens, flow mappings one per line: the kind
of file that gets large. Figures are the best of the rounds; nothing is asserted.
Run: ``python -m loadtests.config_parse [--kib 1024] [--rounds 3]``.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

import yaml

from authn_gateway.config import safe_yaml
from authn_gateway.config.schema import GatewayConfig


def document(size: int) -> str:
    """A valid config of about ``size`` bytes."""
    lines = ["backends:", "  - name: tokens", "    type: static", "    tokens:"]
    total, i = sum(len(line) + 1 for line in lines), 0
    while True:
        line = (
            f"      - {{token: tok-{i:08d}-Hn4Wq8zR, username: user-{i}, uid: '{i}', "
            "groups: [dev, ops]}"
        )
        if total + len(line) + 1 > size:
            return "\n".join(lines) + "\n"
        lines.append(line)
        total += len(line) + 1
        i += 1


def _seconds(fn: Callable[[], object]) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kib", type=int, default=safe_yaml.MAX_BYTES // 1024)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    text = document(min(args.kib * 1024, safe_yaml.MAX_BYTES))
    loaders: dict[str, type[Any]] = {"python": safe_yaml.SafeConfigLoader}
    if yaml.__with_libyaml__:
        loaders["libyaml"] = safe_yaml.FastConfigLoader
        loaders["CSafeLoader"] = yaml.CSafeLoader
    else:
        print("PyYAML was built without libyaml: the Python loader alone")
    best = dict.fromkeys(loaders, float("inf"))
    for _ in range(args.rounds):
        for name, loader in loaders.items():
            seconds = _seconds(lambda loader=loader: yaml.load(text, Loader=loader))
            best[name] = min(best[name], seconds)
    data = safe_yaml.load(text)
    validated = _seconds(lambda: GatewayConfig.model_validate(data))
    print(f"file: {len(text)} bytes, {text.count(chr(10))} lines; best of {args.rounds} rounds")
    print("| loader | seconds | against python |\n|---|---|---|")
    for name, seconds in best.items():
        print(f"| {name} | {seconds:.3f} | {best['python'] / seconds:.1f}x |")
    print(f"validation of the data (pydantic), once: {validated:.3f} s")
    if "libyaml" in best:
        print(f"python / libyaml: {best['python'] / best['libyaml']:.1f}")


if __name__ == "__main__":
    main()
