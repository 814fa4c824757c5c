"""One catalogue entry packaged in a process of its own (``mme package --catalogue`` starts one
per entry, so a failing or memory-hungry entry does not take the others with it)::

    python -m packager.child REQUEST.json RESULT.json

REQUEST.json is a :class:`packager.request.PackageRequest` (``to_dict``). The child packages it
and writes RESULT.json, a :class:`ChildResult`: the formats packaged, or the failure's one-line
reason and error type. Progress and the error also go to stderr, which the parent keeps as the
entry's log for people; the parent reads the result file, never the log.
"""

from __future__ import annotations

import json
import sys
import traceback
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from mme.errors import MmeError
from mme.fsutil import write_json_atomic
from mme.process import die_with_parent
from mme.progress import Reporter
from packager.pipeline import package
from packager.request import PackageRequest

RESULT_SCHEMA_VERSION = 1


@dataclass(frozen=True)
class ChildResult:
    """What became of one entry's request."""

    packaged: tuple[str, ...] = ()  # the formats packaged (all of the request's, or none)
    error: str = ""  # why it failed, in one line ("" when it did not)
    error_type: str = ""  # the error's class: ValidationError, UnknownModelError, ...
    exit_code: int = 0

    @property
    def ok(self) -> bool:
        return not self.error

    def to_dict(self) -> dict[str, Any]:
        return {"schema_version": RESULT_SCHEMA_VERSION, **asdict(self), "packaged": list(self.packaged)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "ChildResult":
        if data.get("schema_version") != RESULT_SCHEMA_VERSION:
            raise ValueError(f"schema version {data.get('schema_version')!r}, not {RESULT_SCHEMA_VERSION}")
        return cls(packaged=tuple(data["packaged"]), error=str(data["error"]), error_type=str(data["error_type"]),
                   exit_code=int(data["exit_code"]))

    @classmethod
    def read(cls, path: Path) -> "ChildResult | None":
        """The result a child wrote at ``path``; None when it wrote none (it was killed) or another."""
        try:
            return cls.from_dict(json.loads(path.read_text(encoding="utf-8")))
        except (OSError, ValueError, KeyError, TypeError):
            return None


def package_request_file(request_path: Path, result_path: Path) -> ChildResult:
    """Package the request of ``request_path``; its result, also written to ``result_path``."""
    reporter = Reporter()
    try:
        request = PackageRequest.from_dict(json.loads(request_path.read_text(encoding="utf-8")))
        artifacts = package(request, reporter)
    except MmeError as exc:
        result = ChildResult(error=str(exc), error_type=type(exc).__name__, exit_code=exc.exit_code)
        print(f"mme: error: {exc}", file=sys.stderr)
    except KeyboardInterrupt:
        result = ChildResult(error="interrupted", error_type="KeyboardInterrupt", exit_code=130)
    except Exception as exc:  # a bug or a library's failure: the traceback for the log, one line for the result
        traceback.print_exc()
        lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
        result = ChildResult(error=f"{type(exc).__name__}: {lines[0] if lines else 'no message'}"[:300],
                             error_type=type(exc).__name__, exit_code=1)
    else:
        for artifact in artifacts:
            reporter.info(artifact.line())
        result = ChildResult(packaged=tuple(a.format for a in artifacts))
    write_json_atomic(result_path, result.to_dict())
    return result


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 2:
        print("usage: python -m packager.child REQUEST.json RESULT.json", file=sys.stderr)
        return 2
    die_with_parent()  # a killed 'mme package --catalogue' leaves no entry running
    return package_request_file(Path(args[0]), Path(args[1])).exit_code


if __name__ == "__main__":
    sys.exit(main())
