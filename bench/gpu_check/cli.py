"""``mme gpu-check``: ``detect`` (what this host has, as shell assignments or --json) and
``run`` (the measurements of :mod:`bench.gpu_check.steps`, written to --out).

Exit codes of ``run``: 0 ran (skips are not failures), 1 something failed, 4 no usable GPU.
tests/gpu/gpu_check.sh calls both on a GPU host, bare ones included.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from bench.gpu_check.steps import GpuCheckOptions as D  # the defaults; the standard library only
from mme.argtypes import fraction, int_at_least, int_list, non_negative_int, positive_float, positive_int


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "gpu-check",
        help="what a GPU host has, and latency, GPU memory per copy and Triton GPU capacity measured on it",
        description="The GPU check: 'detect' says what this host has; 'run' packages a model and measures "
        "TorchScript/TensorRT latency on CUDA, GPU memory per copy (NVML), the copies that fit, an encoder "
        "on CUDA and mme capacity's GPU path on the nvidia-pytriton wheel's Triton. "
        "Exit codes: 0 ran, 1 something failed, 4 no usable GPU.",
    )
    sub = p.add_subparsers(dest="gpu_check_command", metavar="{detect,run}", required=True)
    d = sub.add_parser("detect", help="print what this host has (shell assignments, or --json)")
    d.add_argument("--json", action="store_true", help="print the facts as JSON")
    d.set_defaults(func=run_detect)
    r = sub.add_parser("run", help="the measurements, written to --out")
    r.add_argument("--out", type=Path, required=True,
                   help="directory for facts.json, gpu_check.json/.md and the capacity report")
    r.add_argument("--model", default=D.model, help="image model of steps 1-3 and 5 (default: %(default)s)")
    r.add_argument("--encoder", default=D.encoder, help="Hugging Face encoder of step 4 (default: %(default)s)")
    r.add_argument("--seq-len", type=positive_int, default=D.seq_len, help="encoder sequence length (default: %(default)s)")
    r.add_argument("--batches", type=int_list, default=D.batches, help="batch sizes, comma separated (default: 1,16)")
    r.add_argument("--precision", choices=("fp32", "tf32", "fp16"), default=D.precision,
                   help="TensorRT step (default: %(default)s)")
    r.add_argument("--copies", type=int_at_least(2), default=D.copies,
                   help="copies loaded in-process for memory per copy, 2 or more: the first copy also holds "
                   "shared buffers (default: %(default)s)")
    r.add_argument("--iters", type=positive_int, default=D.iters, help="timed runs per batch size (default: %(default)s)")
    r.add_argument("--warmup", type=non_negative_int, default=D.warmup,
                   help="untimed runs per batch size first (default: %(default)s)")
    r.add_argument("--threshold", type=fraction, default=D.threshold,
                   help="share of GPU memory copies may fill (default: %(default)s)")
    r.add_argument("--triton-headroom-gib", type=positive_float, default=D.triton_headroom_gib,
                   help="step 5 fills the GPU memory in use now plus this much, so it ends in time (default: %(default)s)")
    r.add_argument("--triton-max-copies", type=positive_int, default=D.triton_max_copies,
                   help="cap on the copies step 5 loads (default: %(default)s)")
    r.add_argument("--budget-s", type=positive_float, default=D.budget_s,
                   help="start no step past this many seconds (default: %(default)s)")
    r.add_argument("--device", choices=("cuda", "cpu"), default=D.device,
                   help="cpu: a dry run of every step's code on the CPU (CI runs it), host memory instead of NVML")
    r.set_defaults(func=run)


def run_detect(args: argparse.Namespace) -> int:
    from bench.gpu_check.detect import detect, shell_assignments

    facts = detect()
    print(json.dumps(facts.to_dict(), indent=2) if args.json else shell_assignments(facts))
    return 0


def run(args: argparse.Namespace) -> int:
    from bench.gpu_check.steps import GpuCheckOptions, run_checks

    options = GpuCheckOptions(
        out=args.out, model=args.model, encoder=args.encoder, seq_len=args.seq_len, batches=tuple(args.batches),
        precision=args.precision, copies=args.copies, iters=args.iters, warmup=args.warmup, threshold=args.threshold,
        triton_headroom_gib=args.triton_headroom_gib, triton_max_copies=args.triton_max_copies, budget_s=args.budget_s,
        device=args.device)
    if not options.batches:
        from mme.errors import UsageError

        raise UsageError("--batches: give at least one batch size, like 1,16")
    return run_checks(options)
