"""Model copies without copying files: ``resnet50-v3.tar.gz`` served from ``resnet50.tar.gz``.

The articles upload N copies of one tarball and spread requests over them. Locally the
same effect needs no duplicate files: a wrapped source answers for ``<stem>-v<i>.tar.gz``
(i = 0..copies-1) with the base object. Copies are numbered from 0, as the first article's
notebook copies them and its Locust file (``-v{randint(0, N-1)}``) asks for them; push, serve,
bench and capacity all name them here. Each copy still gets its own cache directory and
its own load in the container, as on SageMaker.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from dataclasses import dataclass, replace

from serving.models.store import ModelSource, ObjectInfo, ObjectReader, TargetNotFound

_COPY = re.compile(r"^(?P<stem>.+)-v(?P<index>\d+)\.tar\.gz$")
FIRST_COPY = 0  # <stem>-v0 ... <stem>-v{N-1}


def copy_indices(copies: int) -> range:
    """The indices of ``copies`` copies: 0 .. copies-1."""
    return range(FIRST_COPY, FIRST_COPY + copies)


def copy_index(n: int) -> int:
    """The index of the ``n``-th copy (n = 1 for the first)."""
    return FIRST_COPY + n - 1


def renumbering_note(stem: str, indices: "set[int] | frozenset[int]", where: str) -> str | None:
    """A one-line warning when ``where`` holds the copies of ``stem`` numbered the old way
    (``-v1`` ... ``-vN``, no ``-v0``); None otherwise."""
    if not indices or FIRST_COPY in indices or min(indices) != FIRST_COPY + 1:
        return None
    top = max(indices)
    return (f"{where} holds {stem}-v1 ... {stem}-v{top} (copies numbered from 1); mme numbers copies from "
            f"{stem}-v0 now, as the first article's notebook and Locust file do (-v0 ... -v{{N-1}}): push again "
            f"(mme push --copies N) to add {stem}-v0, and delete {stem}-v{top} if you want exactly N")


@dataclass(frozen=True)
class CopyName:
    """``resnet50-v3.tar.gz`` -> stem ``resnet50``, index 3 (the copy of ``resnet50.tar.gz``)."""

    stem: str
    index: int

    @property
    def base(self) -> str:
        return f"{self.stem}.tar.gz"


def copy_name(base_target: str, index: int) -> str:
    """The name of copy ``index`` of ``base_target``: ``resnet50.tar.gz``, 3 -> ``resnet50-v3.tar.gz``."""
    stem = base_target[: -len(".tar.gz")] if base_target.endswith(".tar.gz") else base_target
    return f"{stem}-v{index}.tar.gz"


def parse_copy_name(name: str) -> CopyName | None:
    """The stem and index of a copy's name, or None when ``name`` is not named like a copy."""
    match = _COPY.match(name)
    return CopyName(match["stem"], int(match["index"])) if match else None


def is_copy(name: str) -> bool:
    return _COPY.match(name) is not None


class CopiesSource(ModelSource):
    def __init__(self, inner: ModelSource, copies: int) -> None:
        self.inner = inner
        self.copies = copies
        self.uri = getattr(inner, "uri", "")

    def _base(self, target: str) -> str | None:
        parsed = parse_copy_name(target)
        if parsed is not None and parsed.index in copy_indices(self.copies):
            return parsed.base
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
            if info.target.endswith(".tar.gz") and not is_copy(info.target):
                listed.extend(replace(info, target=copy_name(info.target, i)) for i in copy_indices(self.copies))
        return tuple(listed)

    def stat(self, target: str) -> ObjectInfo:
        name, _ = self._resolve(target)
        return replace(self.inner.stat(name), target=target)

    @contextlib.contextmanager
    def open(self, target: str) -> Iterator[ObjectReader]:
        name, _ = self._resolve(target)
        with self.inner.open(name) as reader:
            reader.info = replace(reader.info, target=target)
            yield reader
