"""Which model each request asks for: ``<model>-v<i>.tar.gz`` among N copies, uniform or
Zipf-skewed (a few hot models, a long cold tail), as on a multi-model endpoint."""

from __future__ import annotations

import itertools
import random
from bisect import bisect_left
from dataclasses import dataclass

from mme.errors import UsageError
from serving.models.copies import copy_indices, parse_copy_name, renumbering_note

# serving.models.copies.copy_name's naming: what `mme serve --copies N` answers for.
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
    """The N target names (``{i}`` from 0, as the article's tools number copies), the first the hottest under Zipf."""
    if copies < 1:
        raise UsageError(f"--copies must be at least 1 for a multi-model endpoint (got {copies})")
    if copies > 1 and "{i}" not in template:
        raise UsageError(f"--target-template {template!r} has no {{i}}: all {copies} copies would get the same name")
    try:
        names = tuple(template.format(model=model, i=i) for i in copy_indices(copies))
    except (KeyError, IndexError, ValueError) as exc:
        raise UsageError(f"--target-template {template!r} may use only {{model}} and {{i}} ({exc})") from None
    for name in names:
        if not 1 <= len(name) <= MAX_TARGET_CHARS or not name.isprintable():
            raise UsageError(f"target model name {name!r} must be 1 to {MAX_TARGET_CHARS} printable characters")
    return names


MAX_SHOWN = 6


def _shown(names: tuple[str, ...] | list[str]) -> str:
    text = ", ".join(names[:MAX_SHOWN])
    return text + (f" and {len(names) - MAX_SHOWN} more" if len(names) > MAX_SHOWN else "")


def served_copies(model: str, served: tuple[str, ...]) -> tuple[str, ...]:
    """The copies of ``model`` among the targets an endpoint serves (``mme serve --copies N``'s
    names, serving.models.copies), the lowest index first."""
    parsed = [(c.index, name) for name in served if (c := parse_copy_name(name)) is not None and c.stem == model]
    return tuple(name for _, name in sorted(parsed))


def resolve_targets(model: str, copies: int | None, template: str | None, served: tuple[str, ...] | None,
                    where: str) -> tuple[str, ...]:
    """The targets of a multi-model bench. ``served``: what the endpoint says it answers for
    (``mme serve``'s ``GET /targets``; None where it does not say). Without --copies and
    --target-template, a listing endpoint's copies of ``model`` (else ``<model>.tar.gz``) are
    the targets; otherwise every named target must be among those it serves."""
    if copies is None and template is None and served is not None:
        names = served_copies(model, served) or tuple(n for n in served if n == f"{model}.tar.gz")
        if not names:
            raise UsageError(f"{where} serves no target for model {model!r} (it answers for {_shown(served) or 'nothing'}); "
                             "pass --model NAME or --target-template, or serve this model")
        return names
    names = target_names(model, copies or 1, template or DEFAULT_TEMPLATE)
    if served is not None:
        missing = [n for n in names if n not in set(served)]
        if missing:
            have = served_copies(model, served)
            fix = (f"pass --copies {len(have)} (or leave --copies out)" if have
                   else "leave --copies out" if f"{model}.tar.gz" in served else "check --model")
            raise UsageError(f"{where} does not serve {_shown(missing)} (it answers for {_shown(served)}); {fix}, "
                             f"or start mme serve with --copies {len(names)}")
    return names


def served_renumbering(model: str, served: tuple[str, ...] | None, where: str) -> str | None:
    """A one-line warning when the endpoint serves ``model``'s copies numbered from 1."""
    if served is None:
        return None
    indices = frozenset(c.index for n in served if (c := parse_copy_name(n)) is not None and c.stem == model)
    return renumbering_note(model, indices, where)


class TargetPicker:
    """Picks a target per request; ``pick()`` is on the hot path (one bisect at most)."""

    def __init__(self, names: tuple[str, ...], distribution: Distribution, seed: int | None = None,
                 weights: tuple[float, ...] | None = None) -> None:
        """``weights``: each name's relative popularity (a fleet mix), instead of ``distribution``'s."""
        if not names:
            raise UsageError("no target models to pick from")
        if weights is not None and (len(weights) != len(names) or not sum(weights) > 0):
            raise UsageError("a mix needs one weight per target and a positive total")
        self.names = names
        self.distribution = distribution
        self._random = random.Random(seed)
        if weights is None and distribution.kind == "zipf":
            weights = tuple(zipf_weights(len(names), distribution.s))
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
