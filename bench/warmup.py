"""``mme bench --warmup``: before the first stage, each target gets one request and is asked
again until it answers, so every model is loaded when the measured stages begin and stage
1's latencies are not the models loading one after another. The warm-up's requests are not
in requests.csv or any figure; what it did is saved in run.json (``extra["warmup"]``) and the
report shows it apart. It runs before the baseline snapshot of the endpoint's metrics, so
its loads are not counted as the run's either.

Part of the load generator process: import it only after gevent's monkey patching.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

import gevent
from gevent.pool import Pool

from bench.client import InvokeResult, invoker_for
from bench.config import BenchConfig
from bench.endpoint import resolve_credentials
from mme.progress import Reporter

PARALLEL = 4  # targets warmed at once: an endpoint loads a few models at a time anyway
NOT_READY = 429  # ModelNotReadyException: the load goes on; ask again
RETRY_S = 1.0


@dataclass(frozen=True)
class WarmedTarget:
    target: str  # "" on a single-model endpoint
    ok: bool
    seconds: float  # until it answered (or gave up)
    attempts: int
    latency_ms: float  # of the last attempt
    error: str = ""
    message: str = ""


def warm_up(config: BenchConfig, reporter: Reporter) -> dict:
    """Warm every target of ``config`` (at most PARALLEL at once, each for up to twice the
    request timeout); the summary saved in run.json."""
    targets: tuple[str | None, ...] = config.targets.names or (None,)
    credentials, _ = resolve_credentials(config.endpoint.address)
    invoker = invoker_for(config, credentials, config.payload, PARALLEL + 1)
    timeout_s = config.client.timeout_s
    reporter.info(f"==> warm-up: one answered request for each of {len(targets)} target(s) before the first stage")
    started = time.perf_counter()

    def warm(target: str | None) -> WarmedTarget:
        began = time.perf_counter()
        deadline = began + 2 * timeout_s
        attempts = 0
        while True:
            attempts += 1
            result: InvokeResult = invoker.invoke(target)
            if result.ok or result.status != NOT_READY or time.perf_counter() + RETRY_S > deadline:
                break
            gevent.sleep(RETRY_S)
        seconds = time.perf_counter() - began
        reporter.info(f"  {target or 'the model'}: " + (f"answered in {seconds:.1f} s" if result.ok else
                      f"FAILED after {seconds:.1f} s: {result.error} {result.message}".rstrip()))
        return WarmedTarget(target or "", result.ok, round(seconds, 3), attempts, round(result.latency_ms, 3),
                            result.error, result.message)

    try:
        warmed = Pool(min(PARALLEL, len(targets))).map(warm, targets)
    finally:
        invoker.close()
    total = time.perf_counter() - started
    failed = [w for w in warmed if not w.ok]
    reporter.info(f"  warm-up done in {total:.1f} s: {len(warmed) - len(failed)} of {len(warmed)} answered"
                  + (f"; {len(failed)} failed (the run goes on: their requests will fail too)" if failed else ""))
    return {"seconds": round(total, 3), "targets": len(warmed), "failed": len(failed),
            "per_target": [asdict(w) for w in warmed]}
