"""Which model each request asks for: ``<model>-v<i>.tar.gz`` among N copies, uniform or
Zipf-skewed (a few hot models, a long cold tail), as on a multi-model endpoint."""

from __future__ import annotations

import itertools
import random
from bisect import bisect_left
from dataclasses import dataclass

from mme.errors import UsageError

# serving.copies.copy_name's naming: what `mme serve --copies N` answers for.
DEFAULT_TEMPLATE = "{model}-v{i}.tar.gz"
MAX_TARGET_CHARS = 1024  # InvokeEndpoint's TargetModel limit


@dataclass(frozen=True)
class Distribution:
    kind: str  # "uniform" | "zipf"
    s: float = 0.0  # Zipf exponent

    def __str__(self) -> str:
        return "uniform" if self.kind == "uniform" else f"zipf:{self.s:g}"


def parse_distribution(text: str) -> Distribution:
    if text == "uniform":
        return Distribution("uniform")
    if text.startswith("zipf"):
        exponent = text[len("zipf"):].lstrip(":") or "1.1"
        try:
            s = float(exponent)
        except ValueError:
            s = 0.0
        if not s > 0:
            raise UsageError(f"--distribution zipf:S needs a positive exponent S, like zipf:1.1 (got {text!r})")
        return Distribution("zipf", s)
    raise UsageError(f"--distribution must be uniform or zipf:S (e.g. zipf:1.1), got {text!r}")


def target_names(model: str, copies: int, template: str = DEFAULT_TEMPLATE) -> tuple[str, ...]:
    """The N target names, copy 1 first (the hottest under Zipf)."""
    if copies < 1:
        raise UsageError(f"--copies must be at least 1 for a multi-model endpoint (got {copies})")
    if copies > 1 and "{i}" not in template:
        raise UsageError(f"--target-template {template!r} has no {{i}}: all {copies} copies would get the same name")
    try:
        names = tuple(template.format(model=model, i=i) for i in range(1, copies + 1))
    except (KeyError, IndexError, ValueError) as exc:
        raise UsageError(f"--target-template {template!r} may use only {{model}} and {{i}} ({exc})") from None
    for name in names:
        if not 1 <= len(name) <= MAX_TARGET_CHARS or not name.isprintable():
            raise UsageError(f"target model name {name!r} must be 1 to {MAX_TARGET_CHARS} printable characters")
    return names


class TargetPicker:
    """Picks a target per request; ``pick()`` is on the hot path (one bisect at most)."""

    def __init__(self, names: tuple[str, ...], distribution: Distribution, seed: int | None = None) -> None:
        if not names:
            raise UsageError("no target models to pick from")
        self.names = names
        self.distribution = distribution
        self._random = random.Random(seed)
        weights = zipf_weights(len(names), distribution.s) if distribution.kind == "zipf" else None
        self._cumulative = list(itertools.accumulate(weights)) if weights else None

    def pick(self) -> str:
        if self._cumulative is None:
            return self.names[self._random.randrange(len(self.names))]
        x = self._random.random() * self._cumulative[-1]
        return self.names[min(bisect_left(self._cumulative, x), len(self.names) - 1)]

    def probabilities(self) -> tuple[float, ...]:
        if self._cumulative is None:
            return tuple(1 / len(self.names) for _ in self.names)
        total = self._cumulative[-1]
        previous = 0.0
        out = []
        for c in self._cumulative:
            out.append((c - previous) / total)
            previous = c
        return tuple(out)


def zipf_weights(n: int, s: float) -> list[float]:
    """P(copy i) proportional to 1 / i**s, i = 1..n."""
    return [1.0 / (i ** s) for i in range(1, n + 1)]
