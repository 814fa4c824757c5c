"""Loads of other models against warm traffic on the local MME.

    python benchmarks/bench_load_churn.py [--load-s 4] [--rounds 2]

Runs `mme serve` (local Triton) in its own process on python-backend echo models whose
``initialize`` sleeps ``--load-s`` seconds, and measures, side by side in one run:
- warm latency (p50/p99/max) of an already loaded model while nothing else happens, and
  while other models load one after another (the "churn" window);
- one cold model alone against two cold models requested at the same time (wall time).
Prints the figures and writes results/bench_load_churn.json. ``--tree DIR`` runs the
`mme` of another checkout (e.g. a worktree of an older commit) to compare.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import boto3
import numpy as np
from botocore.config import Config

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks.bench_front import free_port, save_result, tree_environment, wait_for  # noqa: E402
from tests.serving.python_models import echo_request, write_echo_tarball  # noqa: E402


def client(url: str):
    config = Config(retries={"total_max_attempts": 1}, read_timeout=300, max_pool_connections=32)
    return boto3.client("sagemaker-runtime", endpoint_url=url, region_name="us-east-1",
                        aws_access_key_id="bench", aws_secret_access_key="bench", config=config)


def invoke(sm, target: str) -> float:
    start = time.perf_counter()
    sm.invoke_endpoint(EndpointName="local", TargetModel=target, ContentType="application/json", Body=echo_request())
    return time.perf_counter() - start


def warm_latencies(sm, stop: threading.Event, out: list[float]) -> None:
    while not stop.is_set():
        out.append(invoke(sm, "warm.tar.gz"))


def stats(values: list[float]) -> dict:
    ms = np.asarray(values) * 1e3
    return {"n": len(values), "p50_ms": round(float(np.percentile(ms, 50)), 2),
            "p99_ms": round(float(np.percentile(ms, 99)), 2), "max_ms": round(float(ms.max()), 2)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--load-s", type=float, default=4.0, help="seconds each slow model's initialize sleeps")
    parser.add_argument("--rounds", type=int, default=2, help="slow models loaded during the churn window")
    parser.add_argument("--clients", type=int, default=2, help="threads sending warm requests")
    parser.add_argument("--tree", type=Path, help="run the mme of this checkout instead of this one")
    parser.add_argument("--out", type=Path, default=Path("results"))
    args = parser.parse_args(argv)

    models = Path(tempfile.mkdtemp(prefix="bench-churn-"))
    write_echo_tarball(models, "warm.tar.gz")
    slow = [f"slow-{i}.tar.gz" for i in range(args.rounds + 3)]
    for target in slow:
        write_echo_tarball(models, target, load_s=args.load_s)
    port = free_port()
    serve = [sys.executable, "-m", "mme", "-q", "serve", "--models", str(models), "--port", str(port),
             "--server", "local"]
    server = subprocess.Popen(serve, **tree_environment(args.tree))
    result: dict = {"load_s": args.load_s, "tree": str(args.tree or ROOT)}
    try:
        url = f"http://127.0.0.1:{port}"
        wait_for(f"{url}/ping", server)
        clients = [client(url) for _ in range(args.clients)]
        invoke(clients[0], "warm.tar.gz")

        def window(loads: list[str]) -> tuple[list[float], float]:
            stop, lat = threading.Event(), []
            threads = [threading.Thread(target=warm_latencies, args=(sm, stop, lat)) for sm in clients]
            for t in threads:
                t.start()
            start = time.perf_counter()
            if loads:
                for target in loads:
                    invoke(client(url), target)
            else:
                time.sleep(args.load_s * args.rounds)
            elapsed = time.perf_counter() - start
            stop.set()
            for t in threads:
                t.join()
            return lat, elapsed

        quiet, _ = window([])
        churn, churn_s = window(slow[: args.rounds])
        result["warm_quiet"] = stats(quiet)
        result["warm_during_loads"] = stats(churn)
        result["churn_window_s"] = round(churn_s, 2)
        one = invoke(client(url), slow[args.rounds])
        with ThreadPoolExecutor(2) as pool:
            start = time.perf_counter()
            list(pool.map(lambda t: invoke(client(url), t), slow[args.rounds + 1: args.rounds + 3]))
            two = time.perf_counter() - start
        result["cold_one_s"] = round(one, 2)
        result["cold_two_together_s"] = round(two, 2)
    finally:
        server.terminate()
        server.wait(timeout=60)

    print(f"warm, nothing loading:     p50 {result['warm_quiet']['p50_ms']} ms  p99 {result['warm_quiet']['p99_ms']} ms"
          f"  max {result['warm_quiet']['max_ms']} ms  (n={result['warm_quiet']['n']})")
    w = result["warm_during_loads"]
    print(f"warm, {args.rounds} models loading: p50 {w['p50_ms']} ms  p99 {w['p99_ms']} ms  max {w['max_ms']} ms  (n={w['n']})")
    print(f"cold: one model {result['cold_one_s']} s; two models at once {result['cold_two_together_s']} s "
          f"(load {args.load_s:g} s each)")
    save_result(args.out, "bench_load_churn.json", result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
