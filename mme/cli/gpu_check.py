"""``mme gpu-check``: ``detect`` (what this host has, as shell assignments or --json),
``preflight`` (the same for people, in a few seconds) and ``run`` (the preflight, then the
measurements of :mod:`bench.gpu_check.steps`, written to --out after every step).

Exit codes of ``run``: 0 every step measured, 1 something failed, 3 partial (a figure is
missing: named in the headlines), 4 no usable GPU (the CPU dry run too, unless --allow-no-gpu).
tests/gpu/gpu_check.sh calls them on a GPU host, bare ones included.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from bench.gpu_check.steps import GpuCheckOptions as D  # the defaults; the standard library only
from mme.argtypes import fraction, int_list, non_negative_int, positive_float, positive_int
from packager.formats.gpu import PRECISIONS


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "gpu-check",
        help="what a GPU host has, and latency, GPU memory per copy and Triton GPU capacity measured on it",
        description="The GPU check: 'detect' and 'preflight' say what this host has; 'run' prints the preflight, "
        "packages a model and measures Triton python-backend copies on the GPU to the real threshold, TorchScript "
        "latency with TF32 off and on, copies in-process to the real threshold, TensorRT where installed and an "
        "encoder on CUDA, rewriting gpu_check.json after every step. Exit codes: 0 every step measured, 1 something "
        "failed, 3 partial (a figure missing), 4 no usable GPU.",
    )
    sub = p.add_subparsers(dest="gpu_check_command", metavar="{detect,preflight,run}", required=True)
    d = sub.add_parser("detect", help="print what this host has (shell assignments, or --json)")
    d.add_argument("--json", action="store_true", help="print the facts as JSON")
    d.set_defaults(func=run_detect)
    f = sub.add_parser("preflight", help="print what this host has, a line per part the check relies on")
    f.set_defaults(func=run_preflight)
    r = sub.add_parser("run", help="the preflight and the measurements, written to --out")
    r.add_argument("--out", type=Path, required=True,
                   help="directory for facts.json, gpu_check.json/.md and the capacity report")
    r.add_argument("--model", default=D.model, help="image model of steps 1-5 (default: %(default)s)")
    r.add_argument("--encoder", default=D.encoder, help="Hugging Face encoder of step 6 (default: %(default)s)")
    r.add_argument("--seq-len", type=positive_int, default=D.seq_len, help="encoder sequence length (default: %(default)s)")
    r.add_argument("--batches", type=int_list, default=D.batches, help="batch sizes, comma separated (default: 1,16)")
    r.add_argument("--precision", choices=PRECISIONS, default=D.precision,
                   help="TensorRT step; fp32 clears TF32, as TorchScript's TF32-off run (default: %(default)s)")
    r.add_argument("--limit", default=D.limit,
                   help="the memory copies fill to --threshold in steps 2 and 4: an instance type's usable GPU memory "
                   "(mme/instances.toml), 'device' (the whole GPU: slow on a large one) or a size like 20G "
                   "(default: %(default)s)")
    r.add_argument("--max-copies", type=positive_int, default=D.max_copies,
                   help="cap on the copies step 4 loads in this process (default: %(default)s)")
    r.add_argument("--triton-max-copies", type=positive_int, default=D.triton_max_copies,
                   help="cap on the python-backend copies step 2 loads into Triton (default: %(default)s)")
    r.add_argument("--iters", type=positive_int, default=D.iters, help="timed runs per batch size (default: %(default)s)")
    r.add_argument("--warmup", type=non_negative_int, default=D.warmup,
                   help="untimed runs per batch size first (default: %(default)s)")
    r.add_argument("--threshold", type=fraction, default=D.threshold,
                   help="share of the limit copies may fill (default: %(default)s)")
    r.add_argument("--budget-s", type=positive_float, default=D.budget_s,
                   help="start no step past this many seconds (default: %(default)s)")
    r.add_argument("--child-timeout-s", type=positive_float, default=D.child_timeout_s,
                   help="stop a child process (mme package) after this many seconds (default: %(default)s)")
    r.add_argument("--load-timeout-s", type=positive_float, default=D.load_timeout_s,
                   help="give up on a model load into Triton after this many seconds (default: %(default)s)")
    r.add_argument("--device", choices=("cuda", "cpu"), default=D.device,
                   help="cpu: a dry run of every step's code on the CPU (CI runs it), host memory instead of NVML; "
                   "it exits 4 (no GPU) unless --allow-no-gpu")
    r.add_argument("--allow-no-gpu", action="store_true",
                   help="exit 0, not 4, from a run without a GPU (the CPU dry run, for CI)")
    r.set_defaults(func=run)


def run_detect(args: argparse.Namespace) -> int:
    from bench.gpu_check.detect import detect, shell_assignments

    facts = detect()
    print(json.dumps(facts.to_dict(), indent=2) if args.json else shell_assignments(facts))
    return 0


def run_preflight(args: argparse.Namespace) -> int:
    from bench.gpu_check.detect import detect, preflight_lines

    print("\n".join(preflight_lines(detect())))
    return 0


def run(args: argparse.Namespace) -> int:
    from bench.gpu_check import EXIT_NO_GPU
    from bench.gpu_check.steps import GpuCheckOptions, resolve_limit, run_checks
    from mme.errors import UsageError

    if not args.batches:
        raise UsageError("--batches: give at least one batch size, like 1,16")
    resolve_limit(args.limit, 1)  # a bad --limit is a usage error before anything runs
    options = GpuCheckOptions(
        out=args.out, model=args.model, encoder=args.encoder, seq_len=args.seq_len, batches=tuple(args.batches),
        precision=args.precision, limit=args.limit, max_copies=args.max_copies,
        triton_max_copies=args.triton_max_copies, iters=args.iters, warmup=args.warmup, threshold=args.threshold,
        budget_s=args.budget_s, device=args.device, allow_no_gpu=args.allow_no_gpu,
        child_timeout_s=args.child_timeout_s, load_timeout_s=args.load_timeout_s)
    code = run_checks(options)
    if code == EXIT_NO_GPU and args.allow_no_gpu and args.device == "cuda":
        return 0
    return code
