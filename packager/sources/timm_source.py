"""timm image models: any name ``timm.list_models()`` knows, image inputs (3, H, W)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

import numpy as np

from mme.progress import Reporter
from packager.formats.base import package_version
from packager.model import LoadedModel, ModelRequest
from packager.spec import IOSpec, TensorSpec
from packager.weights import load_with_weights

if TYPE_CHECKING:
    import numpy as np

FAMILY = "timm"
# The models the source articles benchmark, shown first in `mme package --list`.
FEATURED = ("resnet50", "convnext_base", "vit_large_patch16_224")


def versions() -> dict[str, str]:
    """The library this family loads models with, as the manifest records it."""
    return {"timm": package_version("timm") or "unknown"}


def list_models(pattern: str | None = None) -> list[str]:
    import timm

    return timm.list_models(pattern or "")


def owns(name: str) -> bool:
    import timm

    base = name.split(".", 1)[0]  # resnet50.a1_in1k -> resnet50 (pretrained tag)
    return bool(timm.is_model(base))


def load(request: ModelRequest, reporter: Reporter) -> LoadedModel:
    import timm
    import torch

    kwargs: dict[str, Any] = {}
    if request.image_size is not None:
        cfg = timm.get_pretrained_cfg(request.name.split(".", 1)[0])
        if cfg is not None and getattr(cfg, "fixed_input_size", False):
            kwargs["img_size"] = request.image_size  # ViT-style models bake the size in

    def create(pretrained: bool, **extra):
        torch.manual_seed(request.seed)
        return timm.create_model(request.name, pretrained=pretrained, **kwargs, **extra)

    def local():
        path = Path(request.weights_path)
        if path.is_dir():
            raise ValueError("timm models take a checkpoint file (.pth, .pt, .safetensors), not a directory")
        return create(False, checkpoint_path=str(path))

    model, weights = load_with_weights(
        request,
        reporter,
        pretrained=lambda: create(True),
        random=lambda: create(False),
        local=local,
    )
    model.eval()
    channels, height, width = model.pretrained_cfg.get("input_size", (3, 224, 224))
    if request.image_size is not None:
        height = width = request.image_size
    with torch.no_grad():
        probe = model(torch.zeros(1, channels, height, width))
    num_classes = int(probe.shape[-1])
    spec = IOSpec(
        task="image-classification",
        inputs=(TensorSpec("pixel_values", "float32", (channels, height, width)),),
        outputs=(TensorSpec("logits", "float32", (num_classes,)),),
        default_atol=1e-4,
    )

    def make_inputs(batch: int, axes: Mapping[str, int], seed: int) -> dict[str, np.ndarray]:
        rng = np.random.default_rng(seed)
        # Normalised images are roughly standard normal per channel.
        return {"pixel_values": rng.standard_normal((batch, channels, height, width), dtype=np.float32)}

    return LoadedModel(
        request=request,
        family=FAMILY,
        module=model,
        spec=spec,
        make_inputs=make_inputs,
        weights=weights,
        parameters=sum(p.numel() for p in model.parameters()),
        details={
            "timm_pretrained_tag": model.pretrained_cfg.get("tag"),
            "mean": list(model.pretrained_cfg.get("mean", ())),
            "std": list(model.pretrained_cfg.get("std", ())),
        },
    )


class TimmSource:
    """timm as a family of :mod:`packager.registry` (its ``ModelSource``): only the names timm knows."""

    supports_tokenizer = False  # image inputs
    open_names = False  # a name must be one timm.list_models() knows
    featured: tuple[str, ...] = FEATURED

    def list_models(self, pattern: str | None = None) -> list[str]:
        return list_models(pattern)

    def owns(self, name: str) -> bool:
        return owns(name)

    def owns_path(self, path: Path) -> bool:
        return False  # a local checkpoint file says nothing of its family: the name decides

    def load(self, request: ModelRequest, reporter: Reporter) -> LoadedModel:
        return load(request, reporter)

    def versions(self) -> dict[str, str]:
        return versions()
