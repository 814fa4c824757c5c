"""Thrash: more copies of a model than the memory limit holds, all of them asked for at once.

    python benchmarks/bench_thrash.py [artifacts/resnet50/cpu-local] [--copies 6] [--fit 2]

First measures, on an endpoint with no limit, the memory the server counts with nothing
loaded and with one copy loaded (``--memory host``). Then serves ``--copies`` copies with a
memory limit that holds ``--fit`` of them below the 0.9 threshold, and sends ``--users``
boto3 clients (retries off) at random copies for ``--duration`` seconds. Prints requests/s,
latency percentiles, failures by error code and the endpoint's load and eviction counts, and
writes results/bench_thrash.json. ``--tree DIR`` runs the `mme` of another checkout (e.g. a
worktree of an older commit) on the same limit, to compare.
"""

from __future__ import annotations

import argparse
import random
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import boto3
import numpy as np
import requests
from botocore.config import Config

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from mme.errors import MmeError  # noqa: E402
from packager.manifest import Manifest  # noqa: E402
from serving.models.copies import copy_name  # noqa: E402
from benchmarks.bench_front import free_port, save_result, tree_environment, wait_for  # noqa: E402

THRESHOLD = 0.9


def client(url: str):
    config = Config(retries={"total_max_attempts": 1}, read_timeout=180, max_pool_connections=8)
    return boto3.client("sagemaker-runtime", endpoint_url=url, region_name="us-east-1",
                        aws_access_key_id="bench", aws_secret_access_key="bench", config=config)


def serve(artifact: Path, copies: int, tree: Path | None, limit: int | None = None,
          verbose: bool = False) -> tuple[subprocess.Popen, str]:
    port = free_port()
    command = [sys.executable, "-m", "mme", *([] if verbose else ["-q"]), "serve", "--models", str(artifact.resolve()), "--port", str(port),
               "--server", "local", "--copies", str(copies), "--memory", "host"]
    if limit is not None:
        command += ["--memory-limit", str(limit)]
    process = subprocess.Popen(command, **tree_environment(tree))
    url = f"http://127.0.0.1:{port}"
    wait_for(f"{url}/ping", process)
    return process, url


def stop(process: subprocess.Popen) -> None:
    process.terminate()
    process.wait(timeout=90)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("artifact", nargs="?", type=Path, default=Path("artifacts/resnet50/cpu-local"))
    parser.add_argument("--copies", type=int, default=6)
    parser.add_argument("--fit", type=int, default=2, help="copies the memory limit holds below the threshold")
    parser.add_argument("--users", type=int, default=6)
    parser.add_argument("--duration", type=float, default=60.0)
    parser.add_argument("--limit", type=int, help="memory limit in bytes (default: measured for --fit copies)")
    parser.add_argument("--tree", type=Path, help="run the mme of this checkout instead of this one")
    parser.add_argument("--verbose", action="store_true", help="show the endpoint's log (loads, evictions)")
    parser.add_argument("--out", type=Path, default=Path("results"))
    args = parser.parse_args(argv)
    try:
        manifest = Manifest.load(args.artifact)
    except MmeError as exc:
        raise SystemExit(f"{exc} (make package MODEL=resnet50 makes one)") from None
    body = (args.artifact / manifest.sample_request.json_file).read_bytes()
    targets = [copy_name(manifest.tarball, i) for i in range(1, args.copies + 1)]

    def invoke(sm, target: str) -> None:
        sm.invoke_endpoint(EndpointName="local", TargetModel=target, ContentType="application/json", Body=body)

    limit = args.limit
    if limit is None:  # measured with this checkout, so every tree gets the same limit
        process, url = serve(args.artifact, args.copies, None)
        try:
            idle = requests.get(f"{url}/metrics.json", timeout=10).json()["gauges"]["MemoryUsedBytes"]
            invoke(client(url), targets[0])
            one = requests.get(f"{url}/metrics.json", timeout=10).json()["gauges"]["MemoryUsedBytes"]
        finally:
            stop(process)
        limit = int((idle + (one - idle) * (args.fit + 0.5)) / THRESHOLD)
        print(f"server alone {idle / 2**20:.0f} MiB, one copy {(one - idle) / 2**20:.0f} MiB more: "
              f"limit {limit / 2**20:.0f} MiB holds {args.fit} copies")

    process, url = serve(args.artifact, args.copies, args.tree, limit, args.verbose)
    latencies: list[float] = []
    errors: Counter[str] = Counter()
    lock = threading.Lock()
    stop_at = time.monotonic() + args.duration

    def user(seed: int) -> None:
        sm, rng = client(url), random.Random(seed)
        while time.monotonic() < stop_at:
            start = time.perf_counter()
            try:
                invoke(sm, rng.choice(targets))
            except Exception as exc:  # noqa: BLE001 (counted by code, the figure this bench reports)
                code = getattr(exc, "response", {}).get("Error", {}).get("Code") or type(exc).__name__
                with lock:
                    errors[code] += 1
                continue
            with lock:
                latencies.append(time.perf_counter() - start)

    try:
        started = time.perf_counter()
        threads = [threading.Thread(target=user, args=(seed,)) for seed in range(args.users)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        elapsed = time.perf_counter() - started
        counts = requests.get(f"{url}/metrics.json", timeout=30).json().get("counts", {})
    finally:
        stop(process)
    ms = np.asarray(latencies) * 1e3
    result = {
        "tree": str(args.tree or ROOT), "copies": args.copies, "fit": args.fit, "users": args.users,
        "limit_bytes": limit, "seconds": round(elapsed, 1), "ok": len(latencies),
        "ok_per_s": round(len(latencies) / elapsed, 2), "errors": dict(errors),
        "p50_ms": round(float(np.percentile(ms, 50)), 1) if len(ms) else None,
        "p95_ms": round(float(np.percentile(ms, 95)), 1) if len(ms) else None,
        "max_ms": round(float(ms.max()), 1) if len(ms) else None,
        "model_loads": counts.get("ModelLoads"), "model_evictions": counts.get("ModelEvictions"),
        "loads_above_threshold": counts.get("LoadsAboveThreshold"),
    }
    print(f"{args.users} users over {args.copies} copies ({args.fit} fit) for {result['seconds']} s: "
          f"{result['ok']} ok ({result['ok_per_s']} req/s), p50 {result['p50_ms']} ms, p95 {result['p95_ms']} ms, "
          f"max {result['max_ms']} ms; errors {dict(errors) or 'none'}; loads {result['model_loads']}, "
          f"evictions {result['model_evictions']}, above threshold {result['loads_above_threshold']}")
    save_result(args.out, "bench_thrash.json", result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
