"""Peak disk written while the model cache fetches a gzip bomb that stays under the size cap.

    python benchmarks/bench_bomb.py [--gib 2.2] [--tree DIR]

Writes a tarball holding a valid echo model plus one file of ``--gib`` GiB of zeros (about
1,000x compression: 2.2 GiB pack to about 2.3 MB, far below the 16 GiB per-tarball cap), then
has `serving.models.cache.ModelCache` fetch it from a local models directory in a child process while
this process samples the bytes allocated under the cache directory every 10 ms. Prints the
peak, the time taken and how the fetch ended, and writes results/bench_bomb.json. ``--tree
DIR`` runs the cache of another checkout (e.g. a worktree of an older commit).
"""

from __future__ import annotations

import argparse
import gzip
import os
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks.bench_front import save_result, tree_environment  # noqa: E402
from tests.serving.python_models import write_echo_model  # noqa: E402
from tests.serving.models.store_helpers import Zeros  # noqa: E402

FETCH = """
import sys
from pathlib import Path
from serving.models.cache import ModelCache
from serving.models.store import LocalDirSource
try:
    ModelCache(Path(sys.argv[1]), LocalDirSource(Path(sys.argv[2]))).fetch("bomb.tar.gz")
    print("accepted")
except Exception as exc:
    print(f"{type(exc).__name__}: {exc}")
"""


def write_bomb(path: Path, size: int) -> None:
    staging = Path(tempfile.mkdtemp(prefix="bomb-model-"))
    model = write_echo_model(staging, "bomb")
    with gzip.open(path, "wb", compresslevel=9) as gz, tarfile.open(fileobj=gz, mode="w|") as tar:
        tar.add(model, arcname="bomb")
        info = tarfile.TarInfo("bomb/1/weights.bin")
        info.size = size
        tar.addfile(info, Zeros(size))


def allocated(root: Path) -> int:
    total = 0
    for directory, _, files in os.walk(root):
        for name in files:
            try:
                total += os.lstat(os.path.join(directory, name)).st_blocks * 512
            except FileNotFoundError:
                pass
    return total


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gib", type=float, default=2.2, help="GiB of zeros in the bomb")
    parser.add_argument("--tree", type=Path, help="run the cache of this checkout instead of this one")
    parser.add_argument("--out", type=Path, default=Path("results"))
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="bench-bomb-"))
    models, cache = work / "models", work / "cache"
    models.mkdir()
    write_bomb(models / "bomb.tar.gz", int(args.gib * 2**30))
    tarball = (models / "bomb.tar.gz").stat().st_size
    peak, done = 0, threading.Event()

    def sample() -> None:
        nonlocal peak
        while not done.is_set():
            if cache.exists():
                peak = max(peak, allocated(cache))
            time.sleep(0.01)

    sampler = threading.Thread(target=sample)
    sampler.start()
    start = time.perf_counter()
    try:
        out = subprocess.run([sys.executable, "-c", FETCH, str(cache), str(models)], capture_output=True, text=True,
                             timeout=900, **tree_environment(args.tree))
    finally:
        done.set()
        sampler.join()
    seconds = time.perf_counter() - start
    outcome = (out.stdout.strip() or out.stderr.strip().splitlines()[-1])[:300]
    left = allocated(cache) if cache.exists() else 0
    result = {"tree": str(args.tree or ROOT), "bomb_gib": args.gib, "tarball_bytes": tarball,
              "peak_written_bytes": peak, "left_bytes": left, "seconds": round(seconds, 2), "outcome": outcome}
    print(f"bomb: {args.gib:g} GiB of zeros in a {tarball / 1e6:.1f} MB tarball; peak written under the cache "
          f"{peak / 2**20:,.1f} MiB, left {left / 2**20:,.1f} MiB after {seconds:.1f} s; {outcome}")
    subprocess.run(["rm", "-rf", str(work)], check=False)
    save_result(args.out, "bench_bomb.json", result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
