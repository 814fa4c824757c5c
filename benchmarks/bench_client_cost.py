"""What one InvokeEndpoint costs the load generator: boto3 vs the bench's fast signed client.

    python benchmarks/bench_client_cost.py [--requests 2000] [--users 20] [--duration 10]

A minimal no-op HTTP endpoint (keep-alive, TCP_NODELAY, answers every POST with a small 200) runs
in its own process. In this process, under gevent's monkey-patching as in a Locust worker, the
two clients send the same small signed request one after another, side by side in one run:

* boto3 ``sagemaker-runtime`` ``invoke_endpoint`` (the articles' client; retries off)
* ``bench.client.FastInvoker``: geventhttpclient + botocore SigV4Auth, per-request constants cached

and the CPU each spends per request is measured with ``time.process_time``. Then ``mme bench``
itself (one Locust process, no wait time) runs against the same endpoint to show the requests/s
one generator process sustains, and at what CPU. Prints a table and writes
results/bench_client_cost.json. Target: the fast client at most 1/5 of boto3's CPU per request.
"""

from gevent import monkey

monkey.patch_all()

import argparse  # noqa: E402
import csv  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from mme.process import child_env  # noqa: E402

SERVER = r'''
import asyncio, socket, sys

REPLY = (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nx-Amzn-Invoked-Production-Variant: AllTraffic\r\n"
         b"Content-Length: 15\r\n\r\n{\"outputs\": []}")
NOT_FOUND = b"HTTP/1.1 404 Not Found\r\nContent-Length: 2\r\n\r\n{}"

class NoOp(asyncio.Protocol):
    def connection_made(self, transport):
        self.transport = transport
        transport.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buffer = b""

    def data_received(self, data):
        self.buffer += data
        while True:
            head_end = self.buffer.find(b"\r\n\r\n")
            if head_end < 0:
                return
            head = self.buffer[:head_end].lower()
            length = 0
            marker = head.find(b"content-length:")
            if marker >= 0:
                length = int(head[marker + 15:].split(b"\r\n", 1)[0])
            if len(self.buffer) < head_end + 4 + length:
                return
            self.buffer = self.buffer[head_end + 4 + length:]
            self.transport.write(NOT_FOUND if head.startswith(b"get /metrics") else REPLY)

async def main():
    server = await asyncio.get_running_loop().create_server(NoOp, "127.0.0.1", 0, backlog=1024)
    print(server.sockets[0].getsockname()[1], flush=True)
    await server.serve_forever()

try:
    import uvloop
    uvloop.run(main())
except ImportError:
    asyncio.run(main())
'''

BODY = json.dumps({"inputs": [{"name": "INPUT0", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}]}).encode()


def start_server() -> tuple[subprocess.Popen, str]:
    process = subprocess.Popen([sys.executable, "-c", SERVER], stdout=subprocess.PIPE, text=True)
    port = int(process.stdout.readline())
    return process, f"http://127.0.0.1:{port}"


def measure(invoke, requests: int) -> dict:
    for _ in range(min(200, requests)):  # warm the connection and caches
        invoke()
    latencies = []
    cpu0, wall0 = time.process_time(), time.perf_counter()
    failures = 0
    for _ in range(requests):
        result = invoke()
        latencies.append(result.latency_ms)
        failures += 0 if result.ok else 1
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    return {"requests": requests, "failures": failures, "cpu_ms_per_request": round(cpu / requests * 1e3, 4),
            "wall_ms_per_request": round(wall / requests * 1e3, 4), "p50_ms": round(statistics.median(latencies), 4)}


def client_costs(url: str, requests: int) -> dict:
    from botocore.credentials import Credentials

    from bench.client import Boto3Invoker, FastInvoker
    from bench.endpoint import resolve_address

    address = resolve_address("noop", url, "us-east-1")
    credentials = Credentials("AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY")
    boto = Boto3Invoker(address, credentials, BODY, "application/json", None, pool_size=1, timeout_s=10)
    fast = FastInvoker(address, credentials, BODY, "application/json", None, pool_size=1, timeout_s=10)
    rows = {}
    # Interleave two rounds each so a slow patch of the machine hits both alike.
    for name, invoker in (("boto3", boto), ("fast", fast), ("boto3 (2)", boto), ("fast (2)", fast)):
        rows[name] = measure(lambda invoker=invoker: invoker.invoke("model-v1.tar.gz"), requests)
    boto.close()
    fast.close()
    best = {name: min(rows[name]["cpu_ms_per_request"], rows[f"{name} (2)"]["cpu_ms_per_request"]) for name in ("boto3", "fast")}
    return {"rounds": rows, "cpu_ms_per_request": best, "ratio_boto3_over_fast": round(best["boto3"] / best["fast"], 2)}


def locust_throughput(url: str, users: int, duration: float, client: str) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        payload = Path(tmp) / "body.json"
        payload.write_bytes(BODY)
        command = [sys.executable, "-m", "mme", "-q", "bench", "--endpoint", "noop", "--endpoint-url", url,
                   "--payload", str(payload), "--model", "model", "--copies", "10", "--shape", "constant",
                   "--users", str(users), "--duration", str(duration), "--wait", "0,0", "--client", client,
                   "--out", tmp, "--run-id", "run"]
        subprocess.run(command, check=True, cwd=ROOT, stdout=subprocess.DEVNULL,
                       env=child_env())
        run = Path(tmp) / "run"
        with open(run / "requests.csv", newline="") as fh:
            rows = list(csv.DictReader(fh))
        with open(run / "stages.csv", newline="") as fh:
            stage = next(csv.DictReader(fh))
    latencies = sorted(float(r["latency_ms"]) for r in rows)
    span = float(stage["end_t"]) - float(stage["start_t"])
    return {"client": client, "users": users, "requests": len(rows), "failures": sum(r["ok"] == "0" for r in rows),
            "requests_per_s": round(len(rows) / span, 1), "p50_ms": round(latencies[len(latencies) // 2], 3),
            "generator_cpu_mean_percent": float(stage["generator_cpu_mean"]),
            "generator_cpu_max_percent": float(stage["generator_cpu_max"])}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000, help="requests per client and round")
    parser.add_argument("--users", type=int, default=20, help="Locust users for the throughput run")
    parser.add_argument("--duration", type=float, default=10.0, help="seconds of the throughput run")
    parser.add_argument("--skip-boto3-locust", action="store_true", help="only the fast client in the Locust run")
    parser.add_argument("--out", type=Path, default=Path("results"))
    args = parser.parse_args(argv)
    server, url = start_server()
    try:
        costs = client_costs(url, args.requests)
        clients = ("fast",) if args.skip_boto3_locust else ("fast", "boto3")
        locust = [locust_throughput(url, args.users, args.duration, client) for client in clients]
    finally:
        server.terminate()
        server.wait(timeout=10)
    cpu = costs["cpu_ms_per_request"]
    print(f"client CPU per request (time.process_time, {args.requests} sequential requests, best of 2 rounds):")
    print(f"  boto3 invoke_endpoint            {cpu['boto3']:.3f} ms")
    print(f"  fast (geventhttpclient + SigV4)  {cpu['fast']:.3f} ms")
    verdict = "meets" if costs["ratio_boto3_over_fast"] >= 5 else "MISSES"
    print(f"  ratio boto3/fast                 {costs['ratio_boto3_over_fast']:.1f}x ({verdict} the 5x target)")
    print(f"one Locust worker process against a no-op endpoint ({args.users} users, no wait, {args.duration:g} s):")
    for row in locust:
        print(f"  {row['client']:<6} {row['requests_per_s']:8.1f} req/s  p50 {row['p50_ms']:6.2f} ms  "
              f"generator CPU mean {row['generator_cpu_mean_percent']:.0f}% max {row['generator_cpu_max_percent']:.0f}%  "
              f"failures {row['failures']}")
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "bench_client_cost.json"
    path.write_text(json.dumps({"schema_version": 1, "client_cost": costs, "locust_worker": locust}, indent=2) + "\n")
    print(f"written {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
