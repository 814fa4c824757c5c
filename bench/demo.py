"""``mme demo``: the whole pipeline on local defaults, no GPU and no cloud account.

package MODEL (cpu-local) -> measure how many copies fit under the memory threshold
(``mme capacity``) -> start the local MME (``mme serve``, its own process) with that many
copies -> a short staged load (the article's shape, time-compressed) spread over the
copies (``mme bench``) -> the report (``mme report``). Each step is the same command a
user would run; this only chains them and prints where everything is.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

from mme.argtypes import byte_size, positive_float
from mme.errors import MmeError
from mme.progress import Reporter
from packager.manifest import Manifest
from serving.triton.base import free_ports


DEMO_ENDPOINT = "local-demo"  # the EndpointName mme serve answers for and mme bench calls

def register(subparsers) -> None:
    p = subparsers.add_parser(
        "demo",
        help="the main job on local defaults: package, capacity, local MME, staged load, report",
        description=__doc__.split("\n\n")[0],
    )
    p.add_argument("--model", default="resnet50", help="model to package (default: %(default)s)")
    p.add_argument("--out", default="artifacts", help="artifact root (default: %(default)s)")
    p.add_argument("--results", default="results", help="results root (default: %(default)s)")
    p.add_argument("--memory-limit", type=byte_size, default=2 * 2**30,
                   help="memory the local endpoint may fill (default: 2G)")
    p.add_argument("--time-scale", type=positive_float, default=0.5,
                   help="compress the article's 340 s staged shape (default: 0.5, about 3 minutes)")
    p.add_argument("--max-copies", type=int, default=20, help="cap on copies measured and served")
    p.add_argument("--repackage", action="store_true", help="package again even if the artifact exists")
    p.set_defaults(func=run)


def _step(reporter: Reporter, number: int, text: str) -> None:
    reporter.info(f"\n==> [{number}/5] {text}")


def _call(argv: list[str]) -> None:
    from mme.cli import main

    code = main(argv)
    if code != 0:
        raise MmeError(f"'mme {' '.join(argv)}' failed (exit {code}); see the message above")


def _wait_ready(url: str, process: subprocess.Popen, timeout_s: float = 60.0) -> None:
    import urllib.error
    import urllib.request

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise MmeError(f"the local endpoint exited with code {process.returncode} before it was ready")
        try:
            with urllib.request.urlopen(f"{url}/ping", timeout=1) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            time.sleep(0.2)
    raise MmeError(f"the local endpoint did not answer {url}/ping within {timeout_s:.0f} s")


def run(args: argparse.Namespace) -> int:
    reporter = Reporter(quiet=args.quiet)
    quiet = ["-q"] if args.quiet else []
    artifact = Path(args.out) / args.model.replace("/", "--") / "cpu-local"
    results = Path(args.results)
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")

    _step(reporter, 1, f"package {args.model} in the cpu-local format")
    if (artifact / "manifest.json").is_file() and not args.repackage:
        reporter.info(f"  {artifact} exists (pass --repackage to build it again)")
    else:
        _call(quiet + ["package", args.model, "--formats", "cpu-local", "--out", args.out])

    _step(reporter, 2, f"how many copies fit in {args.memory_limit / 2**30:.1f} GiB at 90% (mme capacity)")
    capacity_dir = results / f"demo-{stamp}"
    _call(quiet + ["capacity", str(artifact), "--memory-limit", str(args.memory_limit),
                   "--probe-copies", "2", "--max-copies", str(args.max_copies), "--out", str(capacity_dir)])
    manifest = Manifest.load(artifact)
    capacity_file = capacity_dir / f"capacity_{manifest.model}_cpu-local.json"
    report = json.loads(capacity_file.read_text())
    copies = max(1, min(args.max_copies, report["actual_copies"] or report["predicted_copies"]))

    _step(reporter, 3, f"start the local multi-model endpoint with {copies} copies (mme serve)")
    port = free_ports(1)[0]
    url = f"http://127.0.0.1:{port}"
    # The endpoint gets the host's memory: copies grow under load (batched activations), and
    # the demo should show latency against users, not eviction churn.
    serve = subprocess.Popen([sys.executable, "-m", "mme", "-q", "serve", "--models", str(artifact), "--port", str(port),
                              "--copies", str(copies), "--server", "local", "--endpoint-name", DEMO_ENDPOINT])
    try:
        _wait_ready(url, serve)
        reporter.info(f"  {url} (Triton behind it, models load on first request)")
        _step(reporter, 4, f"staged load over the {copies} copies, time scale {args.time_scale} (mme bench)")
        run_id = f"demo-{stamp}-{manifest.model}"
        _call(quiet + ["bench", "--endpoint", DEMO_ENDPOINT, "--endpoint-url", url, "--artifact", str(artifact),
                       "--binary", "--copies", str(copies), "--shape", "staged", "--time-scale", str(args.time_scale),
                       "--out", str(results), "--run-id", run_id])
    finally:
        serve.terminate()
        try:
            serve.wait(timeout=60)
        except subprocess.TimeoutExpired:
            serve.kill()
            serve.wait()
    run_dir = results / run_id
    (run_dir / "capacity.json").write_text(json.dumps(report, indent=2) + "\n")

    _step(reporter, 5, "report (mme report)")
    _call(quiet + ["report", str(run_dir)])
    print(f"\ndemo done: open {run_dir / 'report.html'}")
    print(f"  capacity: {capacity_dir}; artifacts: {artifact}; raw results: {run_dir}")
    return 0
