"""Recovery of the local MME from a Triton crash and from a dead model worker, under load.

    python benchmarks/bench_crash_recovery.py [--clients 4] [--tree DIR]

Runs `mme serve` (local Triton) on python-backend echo models, keeps ``--clients`` threads
sending requests over three models, then (1) kills one model's worker process (kill -9 of its
python-backend stub, what the OOM killer does) and (2) kills tritonserver itself. For each it
prints the time from the kill to the first successful answer for the affected model and the
failed requests in between, and writes results/bench_crash_recovery.json. ``--tree DIR`` runs
the `mme` of another checkout (e.g. a worktree of an older commit) to compare.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil
import requests

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks.bench_front import free_port, save_result, tree_environment, wait_for  # noqa: E402
from benchmarks.bench_load_churn import client  # noqa: E402
from tests.serving.python_models import echo_request, write_echo_tarball  # noqa: E402

TARGETS = ("a.tar.gz", "b.tar.gz", "c.tar.gz")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--give-up-s", type=float, default=90.0, help="stop waiting for a recovery after this long")
    parser.add_argument("--tree", type=Path, help="run the mme of this checkout instead of this one")
    parser.add_argument("--out", type=Path, default=Path("results"))
    args = parser.parse_args(argv)

    models = Path(tempfile.mkdtemp(prefix="bench-crash-"))
    for target in TARGETS:
        write_echo_tarball(models, target)
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "mme", "-q", "serve", "--models", str(models), "--port", str(port),
                               "--server", "local"], **tree_environment(args.tree))
    url = f"http://127.0.0.1:{port}"
    results: dict = {"tree": str(args.tree or ROOT), "clients": args.clients}
    log: list[tuple[float, float, str, bool]] = []  # (sent, answered, target, ok)
    stop = threading.Event()

    def traffic(i: int) -> None:
        sm = client(url)
        n = i
        while not stop.is_set():
            target = TARGETS[n % len(TARGETS)]
            n += 1
            sent = time.perf_counter()
            try:
                sm.invoke_endpoint(EndpointName="local", TargetModel=target, ContentType="application/json",
                                   Body=echo_request())
                log.append((sent, time.perf_counter(), target, True))
            except Exception:  # noqa: BLE001 (every failure is counted, whatever it is)
                log.append((sent, time.perf_counter(), target, False))

    def recovery(killed_at: float, target: str | None) -> dict:
        """First success among requests sent after the kill (for ``target``, or any)."""
        deadline = killed_at + args.give_up_s
        while time.perf_counter() < deadline:
            ok = sorted(end for sent, end, name, good in list(log)
                        if sent > killed_at and good and (target is None or name == target))
            if ok:
                failed = sum(1 for _, end, _, good in list(log) if killed_at < end <= ok[0] and not good)
                return {"first_success_s": round(ok[0] - killed_at, 2), "failed_requests": failed}
            time.sleep(0.05)
        failed = sum(1 for _, end, _, good in list(log) if end > killed_at and not good)
        return {"first_success_s": None, "failed_requests": failed}

    threads = [threading.Thread(target=traffic, args=(i,), daemon=True) for i in range(args.clients)]
    try:
        wait_for(f"{url}/ping", server)
        for target in TARGETS:
            client(url).invoke_endpoint(EndpointName="local", TargetModel=target, ContentType="application/json",
                                        Body=echo_request())
        for t in threads:
            t.start()
        time.sleep(2)
        triton = requests.get(f"{url}/metrics.json", timeout=10).json()["container"]["pid"]
        stubs = [p for p in psutil.Process(triton).children(recursive=True)
                 if any("/model/" in arg and "/a/" in arg for arg in p.cmdline()[1:2])]
        killed_at = time.perf_counter()
        for stub in stubs:
            stub.kill()
        results["worker_killed"] = recovery(killed_at, "a.tar.gz") if stubs else {"error": "no stub found"}
        time.sleep(2)
        triton = requests.get(f"{url}/metrics.json", timeout=10).json()["container"]["pid"]
        killed_at = time.perf_counter()
        os.kill(triton, 9)
        results["triton_killed"] = recovery(killed_at, None)
    finally:
        stop.set()
        server.terminate()
        server.wait(timeout=60)
    for name in ("worker_killed", "triton_killed"):
        r = results[name]
        print(f"{name:>14}: first success {r.get('first_success_s')} s after the kill, "
              f"{r.get('failed_requests')} requests failed in between")
    save_result(args.out, "bench_crash_recovery.json", results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
