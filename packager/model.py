"""The artifacts handed from model sources to exporters."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from packager.spec import InputMaker, IOSpec


@dataclass(frozen=True)
class ModelRequest:
    """What the user asked for: a model name and how to get its weights."""

    name: str
    weights: str = "auto"  # auto | pretrained | random | local
    weights_path: Path | None = None
    image_size: int | None = None  # square input side for image models
    seq_len: int | None = None  # max sequence length for text models
    seed: int = 0


@dataclass(frozen=True)
class LoadedModel:
    """A PyTorch model in eval mode, ready to export, with its declared I/O spec.

    ``module`` takes the spec's inputs positionally (in order) and returns one tensor per
    spec output, as a tensor when there is one output and a tuple otherwise.
    """

    request: ModelRequest
    family: str
    module: Any
    spec: IOSpec
    make_inputs: InputMaker
    weights: str  # "pretrained" | "random" | "local"
    parameters: int
    details: Mapping[str, Any] = field(default_factory=dict)
    tokenizer: Any = None  # a text model's Hugging Face tokenizer, when one was found (hub or local)


def triton_model_name(name: str) -> str:
    """A directory- and Triton-safe model name: ``google/vit-base`` -> ``google--vit-base``."""
    cleaned = re.sub(r"[^A-Za-z0-9_.-]+", "-", name.replace("/", "--")).strip(".-")
    return cleaned or "model"
