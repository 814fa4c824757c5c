"""A stand-in for ``python -m packager.child`` (tests/packager/test_catalogue_child.py): it reads the
request file as the real child does, prints a misleading line to the log, and then writes a result
file (test_resnet) or is killed before it can (test_vit)."""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

from mme.fsutil import write_json_atomic
from packager.child import ChildResult
from packager.request import PackageRequest

REASON = "the reason, from the result file"


def main() -> int:
    request_path, result_path = (Path(a) for a in sys.argv[1:])
    request = PackageRequest.from_dict(json.loads(request_path.read_text()))
    print("mme: error: a decoy line in the log, which the parent must not read", file=sys.stderr, flush=True)
    if request.model.name == "test_vit":
        os.kill(os.getpid(), signal.SIGKILL)
    write_json_atomic(result_path, ChildResult(error=REASON, error_type="ValidationError", exit_code=3).to_dict())
    return 3


if __name__ == "__main__":
    sys.exit(main())
