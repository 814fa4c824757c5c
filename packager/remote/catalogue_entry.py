"""Entry of a ``mme package --catalogue --on sagemaker`` training job, run in the builder image::

    python -m packager.remote.catalogue_entry /opt/ml/input/data/catalogue/job.json

``job.json`` (written by ``catalogue_plan``) names the shard's catalogue next to it, the
output directory (``/opt/ml/model``, which SageMaker uploads as ``output/model.tar.gz``), the
failure file and ``--jobs``. The shard is packaged by ``mme package --catalogue`` as on any
host, so its artifacts, ``catalogue-summary.*`` and ``catalogue-logs/`` come back as a local
run leaves them; ``job_info.json`` adds the GPU and the toolkit version the job had.

The job completes when at least one entry was packaged (the summary says which failed, and
the caller reports them); when none was, the first reason goes to the failure file, which
SageMaker reports as the job's FailureReason, and the job fails.
"""

from __future__ import annotations

import io
import json
import os
import sys
from pathlib import Path
from typing import Any, Sequence, TextIO

JOB_INFO = "job_info.json"
MAX_REASON = 1000  # SageMaker keeps 1,024 characters of FailureReason


class _Tee(io.TextIOBase):
    """stderr that is also kept, to tell SageMaker why the run failed."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.kept = io.StringIO()

    def write(self, text: str) -> int:
        self.kept.write(text)
        return self.stream.write(text)

    def flush(self) -> None:
        self.stream.flush()


def gpu_info() -> dict[str, Any]:
    try:
        import torch

        if torch.cuda.is_available():
            major, minor = torch.cuda.get_device_capability(0)
            return {"gpu": torch.cuda.get_device_name(0), "compute_capability": f"{major}.{minor}",
                    "cuda": torch.version.cuda}
    except Exception as exc:  # the job still reports what it packaged
        return {"gpu": "unknown", "gpu_error": str(exc)}
    return {"gpu": "none"}


def _fail(path: Path, reason: str) -> int:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(reason[:MAX_REASON])
    except OSError as exc:
        print(f"cannot write {path}: {exc}", file=sys.stderr)
    print(f"failed: {reason}", file=sys.stderr)
    return 1


def run(config_path: Path) -> int:
    from mme import __version__
    from mme.cli import main
    from mme.fsutil import write_json_atomic
    from packager.catalogue import SUMMARY_NAME

    config = json.loads(config_path.read_text())
    out, failure = Path(config["out"]), Path(config["failure"])
    catalogue = config_path.parent / config["catalogue"]
    if config.get("mme_version") != __version__:
        print(f"note: planned by mme {config.get('mme_version')}, packaged by mme {__version__} (the artifacts record "
              "this one, so a later run packages them again)", file=sys.stderr)
    tee = _Tee(sys.stderr)
    saved, sys.stderr = sys.stderr, tee
    try:
        code = main(["package", "--catalogue", str(catalogue), "--out", str(out), "--jobs", str(config.get("jobs", 1))])
    finally:
        sys.stderr = saved
    summary_path = out / f"{SUMMARY_NAME}.json"
    if not summary_path.is_file():
        errors = [line for line in tee.kept.getvalue().splitlines() if line.startswith("mme: error:")]
        reason = errors[-1] if errors else f"mme package --catalogue exited {code} without a summary"
        if "cannot write to --out" in reason:
            reason += f" (uid {os.getuid()}); SageMaker mounts it for root: push the job image (make docker-build-job)"
        return _fail(failure, f"{reason} (see the job's log in CloudWatch /aws/sagemaker/TrainingJobs)")
    write_json_atomic(out / JOB_INFO, {"mme_version": __version__, "exit_code": code, **gpu_info()})
    summary = json.loads(summary_path.read_text())
    entries = summary.get("entries", [])
    done = [e for e in entries if e.get("status") in ("packaged", "up to date")]
    if entries and not done:
        first = entries[0]
        return _fail(failure, f"no entry was packaged; {first.get('name')}: {first.get('error') or 'failed'}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1:
        print("usage: python -m packager.remote.catalogue_entry JOB_JSON", file=sys.stderr)
        return 2
    return run(Path(args[0]))


if __name__ == "__main__":
    sys.exit(main())
