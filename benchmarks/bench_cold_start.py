"""Cold start on the local MME: first request to first answer, split into download,
extraction, container load and first inference.

    python benchmarks/bench_cold_start.py [artifacts/resnet50/cpu-local]

Runs `mme serve` in its own process on the artifact's directory, sends the artifact's
sample request with boto3 to a target that is not loaded, reads the endpoint's
/metrics.json, prints the split and writes results/bench_cold_start_<model>.json. It does so
once per ``--networks`` value (``mme serve --triton-network``: Triton in its own network
namespace behind a Unix-socket relay, or on the host's network), so the cost of isolation is
read side by side, start-up to the first ``/ping`` included.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

import boto3
import requests

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from mme.process import stop_process  # noqa: E402
from packager.manifest import MANIFEST_NAME, Manifest  # noqa: E402
from serving.models.copies import copy_name  # noqa: E402
from benchmarks.bench_front import free_port, save_result, tree_environment, wait_for  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("artifact", nargs="?", type=Path, default=Path("artifacts/resnet50/cpu-local"))
    parser.add_argument("--out", type=Path, default=Path("results"))
    parser.add_argument("--tree", type=Path, help="run the mme of this checkout (e.g. a worktree of an older commit)")
    parser.add_argument("--networks", default="private,host", help="--triton-network values to run, in order")
    parser.add_argument("--repeat", type=int, default=3, help="cold starts per network (medians are printed)")
    args = parser.parse_args(argv)
    if not (args.artifact / MANIFEST_NAME).is_file():
        raise SystemExit(f"no {MANIFEST_NAME} in {args.artifact}: run `make package MODEL=resnet50` first")
    manifest = Manifest.load(args.artifact)
    networks = args.networks.split(",")
    runs: dict[str, list[dict]] = {network: [] for network in networks}
    for _ in range(args.repeat):  # interleaved, so drift on the machine falls on both alike
        for network in networks:
            runs[network].append(cold_start(args.artifact, manifest, network, args.tree))
    medians = {network: {key: statistics.median(run[key] for run in done) for key in done[0]}
               for network, done in runs.items()}
    target = copy_name(manifest.tarball, 1)
    print(f"cold start of {target} ({manifest.model}, {manifest.format}, "
          f"{medians[networks[0]]['tarball_mb']} MB tarball), ms, median of {args.repeat}:")
    print(f"  {'':<20}" + "".join(f"{network:>10}" for network in medians))
    for key in ("serve_ready_ms", "download_ms", "extract_ms", "load_ms", "first_inference_ms", "other_ms",
                "first_answer_ms", "warm_answer_ms", "overhead_pct"):
        print(f"  {key:<20}" + "".join(f"{split[key]:>10.1f}" for split in medians.values()))
    print("  overhead_pct: (download + extract + other) / load, the cold path's cost over Triton's own load "
          "(issue 33's target: at most 25%)")
    save_result(args.out, f"bench_cold_start_{manifest.model}.json",
                {"schema_version": 3, "target": target, "median": medians, "runs": runs})
    return 0


def cold_start(artifact: Path, manifest: Manifest, network: str, tree: Path | None) -> dict:
    body = (artifact / manifest.sample_request.json_file).read_bytes()
    port = free_port()
    started = time.perf_counter()
    server = subprocess.Popen([sys.executable, "-m", "mme", "-q", "serve", "--models", str(artifact.resolve()),
                               "--port", str(port), "--server", "local", "--copies", "2",
                               "--triton-network", network], **tree_environment(tree))
    try:
        url = f"http://127.0.0.1:{port}"
        wait_for(f"{url}/ping", server)
        ready_s = time.perf_counter() - started
        sm = boto3.client("sagemaker-runtime", endpoint_url=url, region_name="us-east-1",
                          aws_access_key_id="local", aws_secret_access_key="local")
        target = copy_name(manifest.tarball, 1)
        timings = []
        for _ in range(3):
            start = time.perf_counter()
            sm.invoke_endpoint(EndpointName="local", TargetModel=target, ContentType="application/json", Body=body)
            timings.append(time.perf_counter() - start)
        latency = requests.get(f"{url}/metrics.json", timeout=10).json()["latency_us"]
    finally:
        stop_process(server, 30)

    def first(name: str) -> float:
        return latency[name]["sum"] / 1e3 if name in latency else 0.0  # one event each on a cold start

    split = {
        "serve_ready_ms": round(ready_s * 1e3, 3),
        "download_ms": first("ModelDownloadingTime"),
        "extract_ms": first("ModelExtractionTime"),
        "load_ms": first("ModelLoadingTime"),
        "first_inference_ms": round(latency["ModelLatency"]["max"] / 1e3, 3),
        "first_answer_ms": round(timings[0] * 1e3, 3),
        "warm_answer_ms": round(min(timings[1:]) * 1e3, 3),
        "tarball_mb": round((artifact / manifest.tarball).stat().st_size / 1e6, 1),
    }
    split["other_ms"] = round(split["first_answer_ms"] - split["download_ms"] - split["extract_ms"]
                              - split["load_ms"] - split["first_inference_ms"], 3)
    # Ours on top of the model's own load (Triton's load and its first inference are the model's).
    split["overhead_pct"] = round(100 * (split["download_ms"] + split["extract_ms"] + split["other_ms"])
                                  / max(split["load_ms"], 1e-3), 1)
    return split


if __name__ == "__main__":
    sys.exit(main())
