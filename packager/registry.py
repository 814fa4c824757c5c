"""The registry of model families and the one factory that loads a model by name.

Like timm's registry: a small table of families (:data:`FAMILIES`), ``list_models`` filtering,
and an error for an unknown name that offers the closest known names. Each family is a row:
its name, a description, and a source object implementing :class:`FamilySource` (load, list,
what the family supports). ``mme package --family``'s choices, ``--list`` and the checks of
``--with-tokenizer`` all read the table, so a new family is one row and its module.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from mme.errors import UnknownModelError
from mme.progress import Reporter
from packager.model import LoadedModel, ModelRequest
from packager.sources import hf_source, timm_source


class FamilySource(Protocol):
    """Where a family's models come from, and what the family supports."""

    supports_tokenizer: bool  # text models whose tokenizer --with-tokenizer packages
    open_names: bool  # any name may be one of this family's (hub ids), not only the names it lists
    featured: tuple[str, ...]  # --list without a pattern: a count and these names; () lists every name

    def list_models(self, pattern: str | None = None) -> list[str]: ...

    def owns(self, name: str) -> bool: ...

    def owns_path(self, path: Path) -> bool:
        """Whether local weights at ``path`` are this family's whatever the name (a model directory)."""
        ...

    def load(self, request: ModelRequest, reporter: Reporter) -> LoadedModel: ...

    def versions(self) -> dict[str, str]:
        """The family's library versions, for the manifest."""
        ...


@dataclass(frozen=True)
class ModelFamily:
    name: str  # what --family takes and the manifest's source.family records
    title: str  # how messages name it ("Hugging Face text models")
    description: str
    source: FamilySource

    def list_models(self, pattern: str | None = None) -> list[str]:
        return self.source.list_models(pattern)

    def owns(self, name: str) -> bool:
        return self.source.owns(name)

    def load(self, request: ModelRequest, reporter: Reporter) -> LoadedModel:
        return self.source.load(request, reporter)

    def versions(self) -> dict[str, str]:
        return self.source.versions()


# In the order names are tried: the first family that owns a name packages it.
FAMILIES: tuple[ModelFamily, ...] = (
    ModelFamily(hf_source.FAMILY, "Hugging Face", "Hugging Face transformers encoders, with their tokenizer",
                hf_source.HuggingFaceSource()),
    ModelFamily(timm_source.FAMILY, "timm", "timm image models (any name timm.list_models() knows)",
                timm_source.TimmSource()),
)


def family_names() -> list[str]:
    return [f.name for f in FAMILIES]


def get_family(name: str) -> ModelFamily:
    for family in FAMILIES:
        if family.name == name:
            return family
    raise UnknownModelError(f"unknown model family {name!r}; choose one of: {', '.join(family_names())}")


def list_models(pattern: str | None = None, family: str | None = None) -> dict[str, list[str]]:
    families = [get_family(family)] if family else FAMILIES
    return {f.name: f.list_models(pattern) for f in families}


def resolve(name: str, family: str | None = None, weights_path: Path | None = None) -> ModelFamily:
    """The family that packages ``name``; an unknown name gets the closest known names."""
    if family:
        chosen = get_family(family)
        if not chosen.source.open_names and not chosen.owns(name):
            raise UnknownModelError(_unknown_message(name, chosen.list_models()))
        return chosen
    if weights_path is not None:
        for candidate in FAMILIES:
            if candidate.source.owns_path(weights_path):
                return candidate
    for candidate in FAMILIES:
        if candidate.owns(name):
            return candidate
    known = [n for f in FAMILIES for n in f.list_models()]
    raise UnknownModelError(_unknown_message(name, known))


def _unknown_message(name: str, known: list[str]) -> str:
    close = difflib.get_close_matches(name, known, n=5, cutoff=0.6)
    hint = f"did you mean {', '.join(close)}? " if close else ""
    return f"unknown model {name!r}; {hint}run 'mme package --list' to see the known models"
