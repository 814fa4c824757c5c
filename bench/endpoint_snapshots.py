"""Snapshots of the endpoint's own metrics (``/metrics.json``, where a custom endpoint URL
serves it) taken by ``bench.run`` into ``endpoint_metrics.jsonl``: a baseline before the
first stage (stage -1), one every ``--metrics-interval`` within a stage and one at each stage
end (the last stage's again after the drain, which then closes it), each fetched aside so a
slow endpoint never holds up the driver. The last one gives
run.json's ``models_loaded``. ``bench.endpoint_stages`` turns them into per-stage figures.

Part of the load generator process: import it only after gevent's monkey patching.
"""

from __future__ import annotations

import time
from pathlib import Path

import gevent

from bench import results
from bench.endpoint import EndpointAddress, fetch_metrics

METRICS_TIMEOUT_S = 5.0


class EndpointSnapshots:
    """``enabled`` once the baseline was fetched (the endpoint serves metrics); ``last``: the
    latest snapshot. Counts failed fetches in ``extra["endpoint_metrics_missed"]``."""

    def __init__(self, address: EndpointAddress, run_dir: Path, extra: dict) -> None:
        self.address = address
        self.run_dir = run_dir
        self.extra = extra
        self.enabled = False
        self.last: dict | None = None
        self._baseline: tuple[dict, float] | None = None
        self._t0_wall = 0.0
        self._greenlets: list[gevent.Greenlet] = []

    def fetch_baseline(self) -> None:
        """Before the run: the endpoint's metrics, if it serves them (custom URLs only)."""
        if self.address.custom_url:
            snapshot, taken = fetch_metrics(self.address.url, METRICS_TIMEOUT_S), time.time()
            if snapshot is not None:
                self._baseline, self.enabled = (snapshot, taken), True

    def start(self, t0_wall: float) -> None:
        """The run's clock starts: save the baseline as stage -1, so the first stage's counts are its own."""
        self._t0_wall = t0_wall
        if self._baseline is not None:
            snapshot, taken = self._baseline
            self.last = snapshot
            results.append_endpoint_metrics(self.run_dir, -1, taken - t0_wall, snapshot, at="start")

    def take(self, stage: int, at: str) -> None:
        """Fetch one aside; ``at``: "during" or "end" (of the stage)."""
        if self.enabled:
            self._greenlets = [g for g in self._greenlets if not g.ready()]
            self._greenlets.append(gevent.spawn(self._snapshot, stage, at))

    def _snapshot(self, stage: int, at: str) -> None:
        t = time.time() - self._t0_wall
        snapshot = fetch_metrics(self.address.url, METRICS_TIMEOUT_S)
        if snapshot is None:
            self.extra["endpoint_metrics_missed"] = self.extra.get("endpoint_metrics_missed", 0) + 1
            return
        self.last = snapshot
        results.append_endpoint_metrics(self.run_dir, stage, t, snapshot, at=at)

    def finish(self) -> None:
        """Let the fetches in flight end (up to their timeout), then drop any left."""
        gevent.joinall(self._greenlets, timeout=METRICS_TIMEOUT_S + 1)
        gevent.killall(self._greenlets)

    def models_loaded(self) -> int | None:
        """The endpoint's loaded model count in the last snapshot."""
        if self.last is None:
            return None
        gauges = self.last.get("gauges") or {}
        loaded = gauges.get("LoadedModelCount")
        if loaded is None and isinstance(self.last.get("loaded_models"), list):
            loaded = len(self.last["loaded_models"])
        return int(loaded) if loaded is not None else None
