"""What a package serves, as a strategy the pipeline calls the same way for every request: the
exported model itself (:class:`PlainModel`), or a text ensemble of the packaged tokenizer and the
model (:class:`packager.text_ensemble.TextEnsemble`, ``--with-tokenizer``). :func:`served_kind`
is the one place that chooses."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from mme.progress import Reporter
from packager import layout
from packager.formats.base import ExportedModel, Runner
from packager.model import LoadedModel
from packager.registry import ModelFamily
from packager.request import PackageRequest
from packager.text_ensemble import TextEnsemble
from packager.triton_options import TritonOptions
from packager.validate import reference_cases, validate

if TYPE_CHECKING:  # the generated module's types; at run time the schema packager.model_config chose
    from tritonclient.grpc import model_config_pb2 as mc


class ServedModel(Protocol):
    """One request's served model, shared by every format it is packaged in."""

    def references(self, model: LoadedModel, max_batch: int) -> Any:
        """PyTorch's outputs the exports are validated against (once per request)."""
        ...

    def validate(self, model: LoadedModel, exported: ExportedModel, run: Runner, references: Any, *, atol: float,
                 rtol: float, device: str, device_detail: str, reporter: Reporter) -> dict[str, Any]:
        """One export validated: the manifest's validation record (a mismatch raises)."""
        ...

    def layout(self, root: Path, name: str, model: LoadedModel, exported: ExportedModel, config: mc.ModelConfig,
               options: TritonOptions) -> tuple[layout.Served, tuple[str, ...]]:
        """The Triton model directories and the sample request under ``root``: (what is served, the
        directories the tarball holds after ``name``'s)."""
        ...

    def details(self, name: str) -> dict[str, Any]:
        """What the manifest's ``details`` add."""
        ...


class PlainModel:
    """The exported model, served as it is."""

    @classmethod
    def check_family(cls, name: str, family: ModelFamily) -> None:
        return None  # every family's models serve as they are

    @classmethod
    def for_model(cls, model: LoadedModel, reporter: Reporter, timings: dict[str, float]) -> "PlainModel":
        return cls()

    def references(self, model: LoadedModel, max_batch: int) -> Any:
        return reference_cases(model, max_batch)

    def validate(self, model: LoadedModel, exported: ExportedModel, run: Runner, references: Any, *, atol: float,
                 rtol: float, device: str, device_detail: str, reporter: Reporter) -> dict[str, Any]:
        return validate(model, exported, run, references, atol, reporter, rtol=rtol, device=device,
                        device_detail=device_detail).to_dict()

    def layout(self, root: Path, name: str, model: LoadedModel, exported: ExportedModel, config: mc.ModelConfig,
               options: TritonOptions) -> tuple[layout.Served, tuple[str, ...]]:
        layout.write_model_directory(root, name, exported, config)
        sample = layout.write_sample_request(root, model, exported)
        return layout.Served(model.spec, exported, sample), ()

    def details(self, name: str) -> dict[str, Any]:
        return {}


def served_kind(request: PackageRequest) -> type[PlainModel] | type[TextEnsemble]:
    """What ``request`` serves: its ``check_family`` runs before the model is loaded, its
    ``for_model`` after (the text ensemble checks its tokenizer there)."""
    return TextEnsemble if request.with_tokenizer else PlainModel
