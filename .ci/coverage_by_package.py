"""Line coverage per package from the .coverage data the tests left (pytest-cov), printed as a
table; with --json, the per-package and per-module figures written there too.

    python .ci/coverage_by_package.py --title "fast tier" [--json coverage/coverage.json]

Packages are the product's stages (mme, packager, serving, sizing, bench) and their
sub-packages one level down (serving/runtime, bench/gpu_check, ...). Modules no test imported
count with all their lines missed. Python children the tests start are measured too
(pyproject's [tool.coverage.run] patch = ["subprocess"]), except what runs inside Triton's
python-backend stubs and the broker (``python -I``), which coverage cannot reach.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

import coverage

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("mme", "packager", "serving", "sizing", "bench")


def package_of(relative: Path) -> str:
    parts = relative.parts
    return "/".join(parts[:2]) if len(parts) > 2 else parts[0]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--title", default="coverage")
    parser.add_argument("--data", type=Path, default=ROOT / ".coverage")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = parser.parse_args(argv)
    if not args.data.exists():
        print(f"no coverage data at {args.data}: run the tests with --cov first", file=sys.stderr)
        return 2
    cov = coverage.Coverage(data_file=str(args.data))
    cov.load()
    totals: dict[str, list[int]] = defaultdict(lambda: [0, 0])  # package -> [statements, covered]
    modules: dict[str, dict[str, int]] = {}
    files = sorted(p for package in PACKAGES for p in (ROOT / package).rglob("*.py") if "__pycache__" not in p.parts)
    for path in files:
        relative = path.relative_to(ROOT)
        _, statements, _, missing, _ = cov.analysis2(str(path))
        covered = len(statements) - len(missing)
        modules[str(relative)] = {"statements": len(statements), "covered": covered}
        for key in {package_of(relative), relative.parts[0]}:
            totals[key][0] += len(statements)
            totals[key][1] += covered
    if not totals:
        print("the coverage data names no product module", file=sys.stderr)
        return 2
    width = max(len(k) for k in totals)
    print(f"\n== line coverage, {args.title} ==")
    print(f"{'package':<{width}}  {'lines':>7}  {'covered':>7}  {'%':>6}")
    all_lines = sum(totals[p][0] for p in PACKAGES if p in totals)
    all_covered = sum(totals[p][1] for p in PACKAGES if p in totals)
    for key in sorted(totals, key=lambda k: (k.split("/")[0], k.count("/"), k)):
        lines, covered = totals[key]
        name = key if "/" not in key else "  " + key
        print(f"{name:<{width + 2}}{lines:>7}  {covered:>7}  {100 * covered / max(lines, 1):>5.1f}%")
    print(f"{'total':<{width + 2}}{all_lines:>7}  {all_covered:>7}  {100 * all_covered / max(all_lines, 1):>5.1f}%")
    never = sorted(m for m, f in modules.items() if f["covered"] == 0 and f["statements"])
    if never:
        print(f"modules no test runs ({len(never)}): {', '.join(never)}")
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"title": args.title, "packages": {k: {"statements": v[0], "covered": v[1]}
                                         for k, v in sorted(totals.items())}, "modules": modules}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
