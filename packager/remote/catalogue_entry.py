"""Entry of a ``mme package --catalogue --on sagemaker`` training job, run in the builder image::

    python -m packager.remote.catalogue_entry /opt/ml/input/data/catalogue/job.json

``job.json`` (written by ``catalogue_plan``) names the shard's catalogue next to it, the
output directory (``/opt/ml/model``, which SageMaker uploads as ``output/model.tar.gz``), the
failure file and ``--jobs``. The shard is packaged by :func:`packager.catalogue_run.package_catalogue`,
as ``mme package --catalogue`` packages it on any host, so its artifacts, ``catalogue-summary.*``
and ``catalogue-logs/`` come back as a local run leaves them; ``job_info.json`` adds the GPU and
the toolkit version the job had.

The job completes when at least one entry was packaged (the summary says which failed, and
the caller reports them); when none was, or the shard could not start (the error raised), the
reason goes to the failure file, which SageMaker reports as the job's FailureReason, and the job
fails.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any, Sequence

from mme import __version__
from mme.errors import MmeError
from mme.fsutil import write_json_atomic
from mme.progress import Reporter
from packager.catalogue_run import package_catalogue
from packager.catalogue_summary import SUMMARY_NAME
from packager.remote.catalogue_plan import JOB_INFO

MAX_REASON = 1000  # SageMaker keeps 1,024 characters of FailureReason


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
    config = json.loads(config_path.read_text())
    out, failure = Path(config["out"]), Path(config["failure"])
    catalogue = config_path.parent / config["catalogue"]
    if config.get("mme_version") != __version__:
        print(f"note: planned by mme {config.get('mme_version')}, packaged by mme {__version__} (the artifacts record "
              "this one, so a later run packages them again)", file=sys.stderr)
    try:
        code = package_catalogue(catalogue, out, Reporter(), jobs=int(config.get("jobs", 1)))
    except MmeError as exc:  # the shard, or /opt/ml/model, is wrong: nothing was packaged
        reason = f"mme: error: {exc}"
        if "cannot write to --out" in reason:
            reason += f" (uid {os.getuid()}); SageMaker mounts it for root: push the job image (make docker-build-job)"
        return _fail(failure, f"{reason} (see the job's log in CloudWatch /aws/sagemaker/TrainingJobs)")
    write_json_atomic(out / JOB_INFO, {"mme_version": __version__, "exit_code": code, **gpu_info()})
    summary = json.loads((out / f"{SUMMARY_NAME}.json").read_text())
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
