"""Time each `mme package` stage and the run's peak memory, for one model.

    python benchmarks/bench_package.py resnet50 [--formats torchscript,onnx,cpu-local] [--out DIR]

Runs the real command in a child process (so its peak resident memory is measured alone),
then prints the per-format stage times recorded in each manifest, and writes them as JSON
(results/bench_package_<model>.json by default).

The overhead line is what packaging adds on top of the raw exports: (validate + layout +
tarball) / export, summed over the formats. Each tarball is then written again, in the same
run, with the standard library's zlib (the compressor before ISA-L) from the same model
directories, so the before/after figures come side by side.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from mme.fsutil import deterministic_tar_gz_dirs, write_json_atomic  # noqa: E402
from mme.process import child_env  # noqa: E402
from packager.manifest import Manifest  # noqa: E402

STAGES = ("load", "reference", "export", "validate", "layout", "tarball")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", nargs="?", default="resnet50")
    parser.add_argument("--formats", default="torchscript,onnx,cpu-local")
    parser.add_argument("--out", type=Path, default=Path("results"))
    # Other options (--max-batch-size 8, --opset 17, ...) go to `mme package` as they are; options
    # may come before or after MODEL.
    args, extra = parser.parse_known_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        command = [sys.executable, "-m", "mme", "-q", "package", args.model, "--no-pretrained",
                   "--formats", args.formats, "--out", tmp, *extra]
        start = time.perf_counter()
        subprocess.run(command, check=True, env=child_env({"HF_HUB_OFFLINE": "1"}))
        wall = time.perf_counter() - start
        peak_mib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
        rows = []
        for fmt in args.formats.split(","):
            root = next(Path(tmp).iterdir()) / fmt
            manifest = Manifest.load(root)
            tarball = root / manifest.tarball
            rows.append({
                "format": fmt,
                **{stage: manifest.timings_s.get(stage, 0.0) for stage in STAGES},
                "tarball_zlib": _zlib_seconds(root, manifest),
                "tarball_mb": round(tarball.stat().st_size / 1e6, 1),
                "max_abs_diff": manifest.validation.max_abs_diff,
            })
    print(f"mme package {args.model} on {os.cpu_count()} cores: wall {wall:.1f} s, peak RSS {peak_mib:.0f} MiB")
    print(f"{'format':<12}" + "".join(f"{s:>10}" for s in STAGES) + f"{'tar MB':>9}{'max|diff|':>11}")
    for row in rows:
        print(f"{row['format']:<12}" + "".join(f"{row[s]:>10.2f}" for s in STAGES)
              + f"{row['tarball_mb']:>9.1f}{row['max_abs_diff']:>11.2e}")
    print("(load and reference are shared by all formats; the ONNX export is shared by onnx and cpu-local)")
    export = sum(r["export"] for r in rows)
    after = sum(r["validate"] + r["layout"] + r["tarball"] for r in rows)
    before = sum(r["validate"] + r["layout"] + r["tarball_zlib"] for r in rows)
    tar_after, tar_before = sum(r["tarball"] for r in rows), sum(r["tarball_zlib"] for r in rows)
    overhead = {"export_s": round(export, 2), "after_s": round(after, 2), "before_s": round(before, 2),
                "after_percent": round(100 * after / export, 1) if export else None,
                "before_percent": round(100 * before / export, 1) if export else None,
                "tarball_isal_s": round(tar_after, 2), "tarball_zlib_s": round(tar_before, 2)}
    if export:
        print(f"overhead on top of the exports ({export:.2f} s): validate + layout + tarball {after:.2f} s = "
              f"{overhead['after_percent']:.0f}% with ISA-L; {before:.2f} s = {overhead['before_percent']:.0f}% with "
              f"zlib (tarballs {tar_after:.2f} s vs {tar_before:.2f} s, {tar_before / max(tar_after, 1e-9):.1f}x)")
    result = args.out / f"bench_package_{args.model.replace('/', '--')}.json"
    write_json_atomic(result, {"model": args.model, "wall_s": round(wall, 2), "peak_rss_mib": round(peak_mib),
                               "cpus": os.cpu_count(), "formats": rows, "overhead": overhead})
    print(f"written {result}")
    return 0


def _zlib_seconds(root: Path, manifest: Manifest) -> float:
    """The artifact's tarball written again with zlib level 1 from the same directories (the top
    directories in the order the tarball has them), timed."""
    import tarfile

    with tarfile.open(root / manifest.tarball) as tar:
        tops = list(dict.fromkeys(m.name.split("/")[0] for m in tar.getmembers()))
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        deterministic_tar_gz_dirs([(root / d, d) for d in tops], Path(tmp) / "zlib.tar.gz", compressor="zlib")
        return round(time.perf_counter() - start, 3)


if __name__ == "__main__":
    sys.exit(main())
