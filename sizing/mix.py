"""A fleet's traffic mix: requests/s per model, as ``--mix`` gives it (``zipf:S`` with ``--rps``,
or a TOML file of rates). Used by the fleet plan (:mod:`sizing.fleet`) and by the load test
(``mme bench --mix``, :mod:`bench.mix`)."""

from __future__ import annotations

import math
import tomllib
from pathlib import Path

from mme.errors import UsageError


def zipf_rates(targets: list[str], exponent: float, total_rps: float) -> dict[str, float]:
    """Rates of a Zipf popularity over ``targets`` in their order (the first most popular)."""
    weights = [1.0 / math.pow(rank, exponent) for rank in range(1, len(targets) + 1)]
    scale = total_rps / sum(weights)
    return {t: w * scale for t, w in zip(targets, weights)}


def parse_mix(text: str, rps: float | None, names: list[tuple[str, str]]) -> dict[str, float]:
    """Requests/s per target of ``names`` ((model, tarball name) in catalogue order): ``zipf:S``
    (with --rps: the catalogue's order is the popularity order), or a TOML file with ``[rates]``
    (model or tarball name = requests/s) or ``zipf = S`` and ``rps = R``."""
    by_name = {model: target for model, target in names} | {target: target for _, target in names}
    order = [target for _, target in names]
    if text.startswith("zipf:"):
        try:
            exponent = float(text.removeprefix("zipf:"))
        except ValueError:
            raise UsageError(f"--mix {text}: zipf:S takes a number, e.g. zipf:1.1") from None
        if rps is None:
            raise UsageError(f"--mix {text} needs --rps R: the requests/s over the whole fleet")
        return zipf_rates(order, exponent, rps)
    path = Path(text)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UsageError(f"--mix {text}: no such file; give zipf:S with --rps R, or a TOML file with [rates]") from None
    except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise UsageError(f"--mix {text}: cannot read it as TOML ({exc})") from None
    if "rates" in data:
        rates = {}
        for name, value in data["rates"].items():
            if name not in by_name:
                raise UsageError(f"--mix {text}: {name!r} is not in the catalogue ({', '.join(m for m, _ in names)})")
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                raise UsageError(f"--mix {text}: the rate of {name} must be a number of requests/s, 0 or more")
            rates[by_name[name]] = float(value)
        return {t: rates.get(t, 0.0) for t in order}
    if "zipf" in data:
        total = data.get("rps", rps)
        if total is None:
            raise UsageError(f"--mix {text}: give rps = R next to zipf (or --rps R)")
        return zipf_rates(order, float(data["zipf"]), float(total))
    raise UsageError(f"--mix {text}: give a [rates] table (model = requests/s) or zipf = S with rps = R")
