"""The registry of model families and the one factory that loads a model by name.

Like timm's registry: a small table of families, ``list_models`` filtering, and an error
for an unknown name that offers the closest known names.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from mme.errors import UnknownModelError
from mme.progress import Reporter
from packager.model import LoadedModel, ModelRequest
from packager.sources import hf_source, timm_source


@dataclass(frozen=True)
class ModelFamily:
    name: str
    description: str
    module: ModuleType

    def list_models(self, pattern: str | None = None) -> list[str]:
        return self.module.list_models(pattern)

    def owns(self, name: str) -> bool:
        return self.module.owns(name)

    def load(self, request: ModelRequest, reporter: Reporter) -> LoadedModel:
        return self.module.load(request, reporter)

    def versions(self) -> dict[str, str]:
        """The family's library versions, for the manifest."""
        return self.module.versions()


FAMILIES: tuple[ModelFamily, ...] = (
    ModelFamily(hf_source.FAMILY, "Hugging Face transformers encoders, with their tokenizer", hf_source),
    ModelFamily(timm_source.FAMILY, "timm image models (any name timm.list_models() knows)", timm_source),
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
        # Any name can be a Hugging Face hub id; a timm name must be one timm knows.
        if chosen.name == timm_source.FAMILY and not chosen.owns(name):
            raise UnknownModelError(_unknown_message(name, chosen.list_models()))
        return chosen
    if weights_path is not None and hf_source.owns_path(weights_path):
        return get_family(hf_source.FAMILY)
    for candidate in FAMILIES:
        if candidate.owns(name):
            return candidate
    known = [n for f in FAMILIES for n in f.list_models()]
    raise UnknownModelError(_unknown_message(name, known))


def _unknown_message(name: str, known: list[str]) -> str:
    close = difflib.get_close_matches(name, known, n=5, cutoff=0.6)
    hint = f"did you mean {', '.join(close)}? " if close else ""
    return f"unknown model {name!r}; {hint}run 'mme package --list' to see the known models"

