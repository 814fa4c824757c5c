"""``mme bench --mix MIX --catalogue FILE``: a fleet's load, every model sent its own sample request
with the mix's popularity (a request's target is drawn with probability proportional to its rate).

The targets are the catalogue's tarballs (``<model>.tar.gz``, as ``mme push --catalogue`` and
``mme serve`` name them); each target's body is its artifact's sample request (KServe v2 JSON, or
the binary one with ``--binary``). The mix is ``mme capacity --catalogue``'s: ``zipf:S`` (the
catalogue's order is the popularity order) or a TOML file of rates.
"""

from __future__ import annotations

from pathlib import Path

from bench.config import MixPlan
from bench.payload import from_artifact
from mme.errors import UsageError
from packager.catalogue import catalogue_artifacts
from packager.manifest import Manifest
from sizing.mix import parse_mix


def build_mix(mix: str, catalogue: str, artifacts: str, fmt: str | None, rps: float | None,
              binary: bool) -> MixPlan:
    directories = catalogue_artifacts(Path(catalogue), Path(artifacts), fmt)
    manifests = [Manifest.load(d) for d in directories]
    names = [(m.model, m.tarball) for m in manifests]
    rates = parse_mix(mix, rps if rps is not None else 1.0 if mix.startswith("zipf:") else None, names)
    if not any(rates.values()):
        raise UsageError(f"--mix {mix} gives every model a rate of 0; nothing would be sent")
    payloads = tuple(from_artifact(d, binary=binary) for d in directories)
    targets = tuple(m.tarball for m in manifests)
    return MixPlan(targets, tuple(rates[t] for t in targets), payloads, tuple(m.model for m in manifests), mix,
                   catalogue)
