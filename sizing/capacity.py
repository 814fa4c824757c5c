"""``mme capacity``: the articles' copy-counting loop, done locally and checked.

Start an empty server, measure its baseline, load copies one by one through the container
API measuring after each, predict how many fit under the threshold, then load to the
threshold to check the prediction. ``cycles`` loads and unloads one copy repeatedly and
reports whether memory returns to where it started (users see memory not released).

The report is shared with ``mme capacity --endpoint`` (``sizing.capacity_remote``): each
loop only takes readings into :class:`~sizing.capacity_report.Readings` (baseline, then memory
after each copy); :func:`~sizing.capacity_report.build_report` turns them into what copies cost,
the prediction, the copies that fit and the projections onto other instance types.

The first copy is counted apart: on a GPU it carries the one-time start-up of the first model
on the device (the CUDA context, cuDNN and cuBLAS handles, ONNX Runtime's arena), which the
copies after it do not repeat (bench/gpu_check/copies.py measures the same split). So the
per-copy footprint is the mean over the copies after the first, and the copies that fit are
the largest n with baseline + first copy + (n - 1) x per copy <= threshold x limit. With one
copy measured the first stands in for the per-copy figure (an overestimate) and the report
says so. Projections onto instance types use the same formula with each GPU's usable memory
(the total the driver reports, ``mme/instances.toml``), not its nominal size.
"""

from __future__ import annotations

import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

from mme.errors import MmeError, UsageError
from mme.progress import Reporter
from packager.manifest import Manifest, artifact_directories, is_artifact_directory
from serving.models.cache_entries import cache_key
from serving.models.copies import CopiesSource, copy_index, copy_name
from serving.models.store import LocalDirSource
from serving.monitor.memory import choose_meter
from serving.runtime.startup_checks import check_server_runs
from serving.stack import build_stack
from serving.triton.container import LOAD_TIMEOUT_S, ContainerClient
from serving.triton.factory import choose_kind
from serving.triton.sagemaker_serve import sagemaker_settings_from_environ
from sizing.capacity_report import (
    CapacityReport,
    CapacityStep,
    CopyCost,
    Readings,
    build_capacity_report,
    limit_for_one,
    size_text,
)
from sizing.warm_batch import batched_request, json_request

BURST_CLIENTS = 16  # then this many callers at once, batch 1 each,
BURST_PER_BATCH = 4  # sending this many requests per unit of max batch size between them
# Callers the endpoint will serve at once (--concurrency): the first article's staged shape
# peaks at 200 users. Requests in flight cost memory of two kinds: the endpoint's (Triton's
# buffers for the bodies it holds: a JSON body is parsed into buffers of its own), once, and each
# copy's (the python backend's shared-memory region, which grows with the requests queued on that
# copy and is counted in Triton's and in the copy's process), so every copy is measured after
# serving them.
CONCURRENCY = 200
IN_FLIGHT_ROUNDS = 2  # each of those callers sends this many requests, one after another


@dataclass(frozen=True)
class ServedRate:
    """What the first copy served: ``requests_per_s`` to its burst of BURST_CLIENTS callers at once
    (batched by Triton), and ``latency_s``, one batch-1 request alone. ``measure_capacity`` hands it
    to a ``concurrency`` given as a function, which returns the callers to count in flight."""

    requests_per_s: float
    latency_s: float


def warmup_batches(max_batch: int) -> tuple[int, ...]:
    """The batch sizes of a copy's warm-up requests for a model of ``max_batch`` (0: no
    batching): every size the dynamic batcher can form, largest first (an allocator's arena
    keeps blocks for each shape it served), then the largest again."""
    top = max(1, max_batch)
    return (*range(top, 0, -1), top)


def measure_capacity(artifact: Path, *, threshold: float, limit_bytes: int | None, probe_copies: int = 3,
                     verify: bool = True, cycles: int = 0, max_copies: int = 500,
                     instances: dict[str, dict] | None = None, reporter: Reporter | None = None,
                     cache_dir: Path | None = None, server_kind: str = "local", memory: str = "auto",
                     triton_network: str | None = None, at_rest: bool = False,
                     concurrency: int | Callable[[ServedRate], int] = CONCURRENCY, binary: bool = False,
                     measure_unload: bool = False,
                     load_timeout_s: float = LOAD_TIMEOUT_S) -> CapacityReport:
    """``server_kind`` as ``mme serve --server`` takes it, ``triton_network`` as its ``--triton-network``
    (None: ``$MME_TRITON_NETWORK``, else private); ``memory``: what is counted, "gpu"
    (NVML, the whole device), "host" (RSS of the server's process tree) or "auto" (the GPU
    whenever one is visible and the artifact is not a CPU one).

    Each copy is read twice: right after its load (at rest), and after requests at its max
    batch size and every smaller one (warmup_batches), then a burst of batch-1 requests from many
    callers at once (queues, dynamic batches), then ``concurrency`` callers at once sending it the
    body the load test will (JSON, or ``binary``), IN_FLIGHT_ROUNDS requests each (loaded: what it
    holds while serving that many requests in flight). The prediction counts the loaded figure
    unless ``at_rest``. On the first copy the in-flight requests are read apart: what they add
    there is the endpoint's (request buffers, and that copy's share), counted once before the
    copies; each further copy's loaded figure holds its own share (its shared-memory region).
    ``concurrency`` may be a function of the first copy's :class:`ServedRate` (the demo sizes its
    load, and so the requests in flight, from it). ``load_timeout_s``: how long one copy's load may take. The first copy is counted apart (one-time start-up), the
    per-copy footprint over the probes after it. No copy is loaded once the next one would take
    memory past the limit (not only the threshold). ``memory`` "auto" on a host with an NVIDIA GPU
    whose NVML cannot be read refuses (serving.monitor.memory.choose_meter): pass "host" to accept host RSS."""

    reporter = reporter or Reporter(quiet=True)
    artifact = Path(artifact)
    if not is_artifact_directory(artifact):
        found = artifact_directories(artifact) if artifact.is_dir() else []
        if found:
            raise UsageError(f"{artifact} is above the artifact directories; pass one of them: "
                             + " or ".join(map(str, found[:4])))
        raise UsageError(f"{artifact} has no manifest.json; point at artifacts/<model>/<format> made by 'mme package'")
    manifest = Manifest.load(artifact)
    tarball = manifest.tarball
    kind = choose_kind(server_kind)
    check_server_runs(manifest, kind, str(artifact))
    sample = manifest.sample_request
    warmups = [batched_request(artifact, sample.binary_file, sample.binary_header_size, batch)
               for batch in warmup_batches(manifest.triton.max_batch_size)]
    max_batch = max(w.batch for w in warmups)
    batch_one = batched_request(artifact, sample.binary_file, sample.binary_header_size, 1)
    burst_requests = max(BURST_PER_BATCH * max_batch, BURST_CLIENTS)
    body_kind = "binary" if binary else "json"
    in_flight_body = batch_one if binary else json_request(artifact, sample.json_file)
    burst_clients: list[ContainerClient] = []
    # Triton as SageMaker's image runs it (python shared memory, namespacing; SAGEMAKER_TRITON_*
    # of this environment honoured): what a copy costs there is what is counted here.
    with build_stack(kind, CopiesSource(LocalDirSource(artifact), max_copies + cycles + 1), cache_dir=cache_dir,
                     sagemaker_env=sagemaker_settings_from_environ(os.environ), network=triton_network,
                     prefix="mme-capacity-") as stack:
        cache, server = stack.cache, stack.server
        meter = choose_meter(memory, server.pids, instance_kind=manifest.triton.instance_kind)
        limit = limit_bytes or meter.total()
        server.start()
        try:
            control = stack.client(load_timeout_s=load_timeout_s)
            local = threading.local()

            def burst_client() -> ContainerClient:
                if not hasattr(local, "client"):
                    local.client = stack.client()
                    burst_clients.append(local.client)
                return local.client

            def used() -> int:
                time.sleep(0.2)  # let the stub settle
                return meter.used()

            def load(target: str) -> tuple[float, str]:
                cached = cache.fetch(target)
                started = time.perf_counter()
                control.load(cached.container_name, server.model_url(cached.model_dir), target=target)
                return time.perf_counter() - started, cached.container_name

            def check(result, target: str, batch: int) -> None:
                if not result.ok:
                    raise MmeError(f"{target} failed its warm-up request at batch {batch} (HTTP "
                                   f"{result.status}: {result.body[:200].decode(errors='replace').strip()}); "
                                   "the model cannot serve its own max batch size here")

            rates: list[ServedRate] = []
            callers: list[int] = []

            def warm(name: str, target: str) -> None:
                latency = 0.0
                for request in warmups:
                    started = time.perf_counter()
                    check(control.invoke(name, request.body, request.content_type, target=target), target, request.batch)
                    if request.batch == 1:
                        latency = time.perf_counter() - started
                # then many callers at once: requests queue in Triton and its dynamic batcher
                # forms batches of them, as under a load test
                single = warmups[-1] if max_batch == 1 else batch_one
                started = time.perf_counter()
                with ThreadPoolExecutor(BURST_CLIENTS) as pool:
                    for result in pool.map(lambda _: burst_client().invoke(name, single.body, single.content_type,
                                                                           target=target), range(burst_requests)):
                        check(result, target, 1)
                if not rates:
                    rates.append(ServedRate(burst_requests / (time.perf_counter() - started), latency))
                if callers:  # the first copy's in-flight requests are read apart (note_overhead)
                    in_flight(name, target)

            def in_flight(name: str, target: str) -> None:
                """``callers`` at once, IN_FLIGHT_ROUNDS requests each, the load test's body."""
                def caller(_: int) -> None:
                    client = burst_client()
                    for _round in range(IN_FLIGHT_ROUNDS):
                        check(client.invoke(name, in_flight_body.body, in_flight_body.content_type, target=target),
                              target, 1)

                with ThreadPoolExecutor(callers[0]) as pool:
                    list(pool.map(caller, range(callers[0])))

            baseline = used()
            mib = 2**20
            reporter.info(f"==> capacity of {manifest.model} ({manifest.format}): baseline {baseline / mib:.0f} MiB, "
                          f"limit {limit / mib:.0f} MiB, threshold {threshold:.0%}; counting {meter.description}; "
                          f"each copy at rest and after requests at batch {max_batch} down to 1, then "
                          f"{burst_requests} from {BURST_CLIENTS} callers at once, then "
                          f"{concurrency if isinstance(concurrency, int) else 'the load test'}'s callers at once "
                          f"({body_kind} bodies, {IN_FLIGHT_ROUNDS} each) for the requests in flight")
            readings = Readings(manifest.model, manifest.format, meter.description, limit, threshold, baseline)

            def load_next() -> CapacityStep:
                target = copy_name(tarball, copy_index(len(readings.steps) + 1))
                seconds, name = load(target)
                rest = used()
                warm(name, target)
                step = readings.record(used(), seconds, rest_bytes=rest)
                reporter.info(f"  copy {step.copies:>3}: {step.memory_bytes / mib:8.0f} MiB (+{(rest - step.memory_bytes + step.delta_bytes) / mib:.0f} "
                              f"MiB at rest, +{step.delta_bytes / mib:.0f} MiB loaded; loaded in {seconds:.2f} s, "
                              f"{step.memory_bytes / limit:.1%} of the limit)")
                return step

            def next_fits() -> bool:
                """Whether one more copy, as large as the largest after the first so far (the first
                until there is one: it carries the one-time start-up), stays under the limit."""
                further = [s.delta_bytes for s in readings.steps if s.copies > 1]
                largest = max(further or [s.delta_bytes for s in readings.steps], default=0)
                return readings.memory_bytes + largest <= limit

            first = load_next()  # one copy is needed to measure anything
            rate = rates[0]
            callers.append(max(1, concurrency(rate) if callable(concurrency) else concurrency))
            reporter.info(f"  served {rate.requests_per_s:.1f} requests/s to {BURST_CLIENTS} callers at once, "
                          f"{1000 * rate.latency_s:.0f} ms for one request alone")
            # the endpoint's requests in flight, counted once: measured on the first copy, before
            # the other probes, so that they too are loaded only where they fit with it
            first_name = copy_name(tarball, copy_index(first.copies))
            in_flight(cache_key(first_name), first_name)
            overhead = readings.note_overhead(used())
            reporter.info(f"  requests in flight from {callers[0]} callers ({body_kind} bodies): +{overhead / mib:.0f} "
                          "MiB, the endpoint's, counted once; each further copy is read after serving them too")
            while len(readings.steps) < probe_copies and next_fits():
                load_next()
            probes = tuple(readings.steps)
            cost = CopyCost.of(probes, at_rest=at_rest)
            base = baseline + overhead
            predicted = cost.predict(base, limit, threshold)
            reporter.info(f"  {'at rest' if at_rest else 'loaded'}: {cost.line()}: predicted {predicted} copies "
                          f"under {threshold:.0%}" + (f" (a limit of {size_text(limit_for_one(base, cost.first_bytes, threshold))} "
                                                      "or more fits one)" if predicted == 0 else ""))
            if verify:
                if predicted > max_copies:
                    raise UsageError(f"{predicted} copies predicted: more than --max-copies {max_copies}; "
                                     "pass a smaller --memory-limit or --no-verify")
                while (readings.memory_bytes <= readings.budget_bytes and len(readings.steps) < max_copies
                       and next_fits()):
                    load_next()
                if not next_fits():
                    reporter.info(f"  stopped: one more copy would take memory past the limit ({limit / mib:.0f} MiB)")
                reporter.info(f"  actual: {readings.fitted()} copies fit (predicted {predicted})")
            leak = (_leak_check(control, cache, server, tarball, len(readings.steps), cycles, used, reporter)
                    if cycles else None)
            unload_s = _time_unload(control, meter, first_name, first.delta_bytes) if measure_unload else None
        finally:
            for client in (control, *burst_clients):
                client.close()
            server.stop()
    report = build_capacity_report(readings, probes, verified=verify, leak_check=leak, instances=instances, at_rest=at_rest,
                          warmup_batch=max_batch, warmup_concurrency=BURST_CLIENTS, overhead_concurrency=callers[0],
                          overhead_body=body_kind)
    return replace(report, unload_seconds=unload_s, served_rps=round(rates[0].requests_per_s, 3),
                   served_latency_ms=round(1000 * rates[0].latency_s, 3), in_flight_rounds=IN_FLIGHT_ROUNDS)


UNLOAD_POLL_S = 0.05
UNLOAD_WAIT_S = 10.0


def _time_unload(control, meter, target: str, footprint: int) -> float:
    """Seconds from asking the container to unload ``target`` until half its footprint is back:
    how long an eviction holds memory a load waits for (the unload call itself may return later,
    or sooner, than the memory)."""
    before = meter.used()
    started = time.perf_counter()
    with ThreadPoolExecutor(1) as pool:
        call = pool.submit(control.unload, cache_key(target), target=target)
        while time.perf_counter() - started < UNLOAD_WAIT_S:
            if meter.used() <= before - footprint / 2:
                freed = time.perf_counter() - started
                break
            time.sleep(UNLOAD_POLL_S)
        else:
            freed = time.perf_counter() - started
        call.result()
    return round(freed, 3)


def _leak_check(control, cache, server, tarball, loaded, cycles, used, reporter) -> dict:
    target = copy_name(tarball, copy_index(loaded + 1))
    cached = cache.fetch(target)
    start = used()
    readings = []
    for _ in range(cycles):
        control.load(cached.container_name, server.model_url(cached.model_dir), target=target)
        control.unload(cached.container_name, target=target)
        time.sleep(0.5)  # the stub process exits after the unload returns
        readings.append(used())
    growth = readings[-1] - start
    returned = growth <= max(16 * 2**20, 0.05 * start)
    reporter.info(f"  leak check: {cycles} load/unload cycles, memory {start / 2**20:.0f} -> {readings[-1] / 2**20:.0f} MiB "
                  f"({'returns to where it started' if returned else 'does NOT return to where it started'})")
    return {"cycles": cycles, "start_bytes": start, "after_each_bytes": readings, "growth_bytes": growth,
            "returned_to_baseline": returned}
