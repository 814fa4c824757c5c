"""Model copies without copying files: ``resnet50-v3.tar.gz`` served from ``resnet50.tar.gz``.

The articles upload N copies of one tarball and spread requests over them. Locally the
same effect needs no duplicate files: a wrapped source answers for ``<stem>-v<i>.tar.gz``
(i = 1..copies) with the base object. Each copy still gets its own cache directory and
its own load in the container, as on SageMaker.
"""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

from serving.store import ModelSource, ObjectInfo, TargetNotFound

_COPY = re.compile(r"^(?P<stem>.+)-v(?P<index>\d+)\.tar\.gz$")


def copy_name(base_target: str, index: int) -> str:
    stem = base_target[: -len(".tar.gz")] if base_target.endswith(".tar.gz") else base_target
    return f"{stem}-v{index}.tar.gz"


class CopiesSource(ModelSource):
    def __init__(self, inner: ModelSource, copies: int) -> None:
        self.inner = inner
        self.copies = copies
        self.uri = getattr(inner, "uri", "")

    def _base(self, target: str) -> str | None:
        match = _COPY.match(target)
        if match and 1 <= int(match["index"]) <= self.copies:
            return f"{match['stem']}.tar.gz"
        return None

    def _resolve(self, target: str) -> tuple[str, bool]:
        base = self._base(target)
        if base is None:
            return target, False
        try:
            self.inner.stat(target)  # a real object of that name wins
            return target, False
        except TargetNotFound:
            return base, True

    def list_targets(self) -> tuple[ObjectInfo, ...]:
        listed = list(self.inner.list_targets())
        for info in tuple(listed):
            if info.target.endswith(".tar.gz") and not _COPY.match(info.target):
                listed.extend(replace(info, target=copy_name(info.target, i)) for i in range(1, self.copies + 1))
        return tuple(listed)

    def stat(self, target: str) -> ObjectInfo:
        name, _ = self._resolve(target)
        return replace(self.inner.stat(name), target=target)

    def download(self, target: str, dest: Path) -> ObjectInfo:
        name, _ = self._resolve(target)
        return replace(self.inner.download(name, dest), target=target)
