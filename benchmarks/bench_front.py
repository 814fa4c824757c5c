"""The local front's added cost over calling the container directly, side by side, with Triton
in its own network namespace (the default) and on the host's network.

    python benchmarks/bench_front.py [--requests 1600] [--rounds 3] [--clients 1,16] [--networks private,host]

A trivial python-backend model (identity on 4 floats) is served by the real Triton; the same
HTTP client (one keep-alive session per client thread) calls Triton's MME invoke route
directly (through the Unix-socket relay when Triton is isolated) and then the front's
/endpoints/{name}/invocations, in ``--rounds`` alternating rounds (direct, front, direct, ...: drift
on the machine falls on both alike), each ``--requests`` requests spread over the clients. For
each ``--triton-network`` it prints the median over the rounds of p50/p99 latency and
requests/s of both routes, the p50 added by the front and the throughput ratio; then what
isolation costs at the front (p50 and requests/s, private against host). Writes
results/bench_front.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from pathlib import Path

import requests

from mme.fsutil import write_json_atomic
from mme.process import child_env
from serving.models.cache_entries import cache_key
from serving.triton.config import free_ports
from serving.triton.container_transport import http_session

MODEL_PY = '''
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse(output_tensors=[
            pb_utils.Tensor("OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy())]) for r in requests]
'''


def trivial_model(root: Path) -> Path:
    from tritonclient.grpc import model_config_pb2 as mc

    from packager.triton_config import write_config

    model = root / "identity"
    (model / "1").mkdir(parents=True)
    config = mc.ModelConfig(backend="python", max_batch_size=8)
    config.input.add(name="INPUT0", data_type=mc.TYPE_FP32, dims=[4])
    config.output.add(name="OUTPUT0", data_type=mc.TYPE_FP32, dims=[4])
    config.instance_group.add(count=1, kind=mc.ModelInstanceGroup.KIND_CPU)
    write_config(config, model / "config.pbtxt")
    (model / "1" / "model.py").write_text(MODEL_PY)
    models = root / "models"
    models.mkdir()
    with tarfile.open(models / "identity.tar.gz", "w:gz") as tar:
        tar.add(model, arcname="identity")
    return models


def free_port() -> int:
    return free_ports(1)[0]


def wait_for(url: str, process: subprocess.Popen, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"mme serve exited with {process.returncode}")
        try:
            if requests.get(url, timeout=1).status_code == 200:
                return
        except requests.ConnectionError:
            pass
        time.sleep(0.2)
    raise SystemExit(f"mme serve did not answer {url} within {timeout_s:.0f} s")


def drive(url: str, headers: dict, body: bytes, clients: int, per_client: int) -> dict:
    latencies: list[float] = []
    lock = threading.Lock()
    failures = [0]

    def worker() -> None:
        session = http_session()
        mine = []
        for _ in range(per_client):
            start = time.perf_counter()
            response = session.post(url, data=body, headers=headers)
            mine.append(time.perf_counter() - start)
            if response.status_code != 200:
                failures[0] += 1
        with lock:
            latencies.extend(mine)

    threads = [threading.Thread(target=worker) for _ in range(clients)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    latencies.sort()
    return {"requests": len(latencies), "failures": failures[0], "rps": round(len(latencies) / wall, 1),
            "p50_ms": round(statistics.median(latencies) * 1e3, 3),
            "p99_ms": round(latencies[int(0.99 * (len(latencies) - 1))] * 1e3, 3)}


FIXED_SIGNATURE = ("AWS4-HMAC-SHA256 Credential=bench/20260101/us-east-1/sagemaker/aws4_request, "
                   "SignedHeaders=host;x-amz-date, Signature=" + "0" * 64)


def save_result(out: Path, name: str, data: object) -> Path:
    """Write a benchmark's figures to ``out/name`` (JSON, atomically) and say where."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / name
    write_json_atomic(path, data)
    print(f"wrote {path}")
    return path


def tree_environment(tree: Path | None) -> dict:
    """Popen arguments that run `python -m mme` from ``tree`` instead of this checkout."""
    if tree is None:
        return {}
    return {"env": child_env(root=tree), "cwd": str(tree)}


def median_run(runs: list[dict]) -> dict:
    """Per figure, the median over rounds (requests and failures summed)."""
    return {key: (sum(r[key] for r in runs) if key in ("requests", "failures") else
                  round(statistics.median(r[key] for r in runs), 3)) for key in runs[0]}


def measure(models: Path, network: str, clients_list: list[int], requests_per: int, tree: Path | None,
            rounds: int = 3) -> list[dict]:
    """Rows for one ``mme serve --triton-network network``: direct and front figures per client count."""
    body = json.dumps({"inputs": [{"name": "INPUT0", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}]}).encode()
    headers = {"Content-Type": "application/json"}
    rows = []
    # `mme serve` in its own process, as users run it: the front shares no interpreter with the clients.
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "mme", "-q", "serve", "--models", str(models),
                               "--port", str(port), "--server", "local", "--triton-network", network],
                              **tree_environment(tree))
    try:
        url = f"http://127.0.0.1:{port}"
        wait_for(f"{url}/ping", server)
        front = f"{url}/endpoints/local/invocations"
        # The front checks that a SigV4 signature is there (SageMaker answers 403 otherwise) but
        # never verifies it: a fixed one keeps signing cost out of the comparison.
        front_headers = dict(headers, **{"X-Amzn-SageMaker-Target-Model": "identity.tar.gz",
                                         "Authorization": FIXED_SIGNATURE})
        drive(front, front_headers, body, 1, 20)  # loads the model, warms both paths
        # Triton's own MME invoke, as SageMaker's front end calls it: the hash, the target in a header.
        container = requests.get(f"{url}/metrics.json", timeout=10).json()["container"]["url"]
        direct = f"{container}/models/{cache_key('identity.tar.gz')}/invoke"
        headers = dict(headers, **{"X-Amzn-SageMaker-Target-Model": "identity.tar.gz"})
        drive(direct, headers, body, 1, 20)
        for clients in clients_list:
            per_client = max(1, requests_per // clients)
            directs, fronts = [], []
            for _ in range(rounds):
                directs.append(drive(direct, headers, body, clients, per_client))
                fronts.append(drive(front, front_headers, body, clients, per_client))
            d, f = median_run(directs), median_run(fronts)
            rows.append({"network": network, "clients": clients, "direct": d, "front": f, "rounds": rounds,
                         "added_p50_ms": round(f["p50_ms"] - d["p50_ms"], 3),
                         "throughput_ratio": round(f["rps"] / d["rps"], 3)})
    finally:
        server.terminate()
        server.wait(timeout=30)
    return rows


def isolation_cost(rows: list[dict]) -> list[dict]:
    """Per client count: the front's p50 and requests/s with Triton isolated against on the host's network."""
    by = {(r["network"], r["clients"]): r for r in rows}
    cost = []
    for (network, clients), private in sorted(by.items()):
        host = by.get(("host", clients))
        if network != "private" or host is None:
            continue
        cost.append({"clients": clients, "front_p50_ms": {"private": private["front"]["p50_ms"],
                                                          "host": host["front"]["p50_ms"]},
                     "added_p50_ms": round(private["front"]["p50_ms"] - host["front"]["p50_ms"], 3),
                     "rps_ratio": round(private["front"]["rps"] / host["front"]["rps"], 3)})
    return cost


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=1600, help="requests per client count, route and round")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds per route (medians are printed)")
    parser.add_argument("--clients", default="1,16")
    parser.add_argument("--networks", default="private,host", help="--triton-network values to run, in order")
    parser.add_argument("--out", type=Path, default=Path("results"))
    parser.add_argument("--tree", type=Path, help="run the mme of this checkout (e.g. a worktree of an older commit)")
    args = parser.parse_args(argv)
    clients_list = [int(c) for c in args.clients.split(",")]
    rows: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        models = trivial_model(Path(tmp))
        for network in args.networks.split(","):
            rows += measure(models, network, clients_list, args.requests, args.tree, args.rounds)
    print(f"{'network':>8} {'clients':>7} {'direct p50':>11} {'front p50':>10} {'added p50':>10} {'direct rps':>11} "
          f"{'front rps':>10} {'ratio':>6}")
    for r in rows:
        print(f"{r['network']:>8} {r['clients']:>7} {r['direct']['p50_ms']:>9.2f}ms {r['front']['p50_ms']:>8.2f}ms "
              f"{r['added_p50_ms']:>8.2f}ms {r['direct']['rps']:>11.1f} {r['front']['rps']:>10.1f} "
              f"{r['throughput_ratio']:>6.2f}")
    print("added p50: front p50 - direct p50; ratio: front rps / direct rps (issue 33's targets: at most 0.5 ms "
          "at 1 client, at least 0.95 at 16)")
    cost = isolation_cost(rows)
    for c in cost:
        print(f"isolation at {c['clients']} client(s): front p50 {c['front_p50_ms']['private']:.2f} ms private vs "
              f"{c['front_p50_ms']['host']:.2f} ms host ({c['added_p50_ms']:+.2f} ms); throughput ratio {c['rps_ratio']:.2f}")
    save_result(args.out, "bench_front.json", {"schema_version": 3, "rows": rows, "isolation_cost": cost})
    return 0


if __name__ == "__main__":
    sys.exit(main())
