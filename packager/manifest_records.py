"""The typed sub-records of manifest.json (see :mod:`packager.manifest`): where the weights
came from, how Triton serves the model and which release it targets, its tensors, the
validation, the files and sample request, and the build details. Each is frozen and has
``from_dict`` / ``to_dict``; a missing or wrong field raises :class:`ManifestFieldError`
naming its path.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping


class ManifestFieldError(ValueError):
    """A manifest.json that lacks a field or has one of the wrong kind (the path names it)."""


def required_field(data: Mapping[str, Any], key: str, where: str) -> Any:
    if not isinstance(data, Mapping):
        raise ManifestFieldError(f"{where} is not an object")
    if key not in data:
        raise ManifestFieldError(f"{where}.{key} is missing" if where else f"{key} is missing")
    return data[key]


def object_field(value: Any, where: str) -> dict:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ManifestFieldError(f"{where} is not an object")
    return dict(value)


def _rest(data: Mapping[str, Any], known: tuple[str, ...]) -> dict[str, Any]:
    return {k: v for k, v in data.items() if k not in known}


@dataclass(frozen=True)
class FileEntry:
    path: str  # relative to the artifact directory
    sha256: str
    bytes: int

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], where: str = "files[]") -> "FileEntry":
        return cls(str(required_field(data, "path", where)), str(required_field(data, "sha256", where)),
                   int(required_field(data, "bytes", where)))

    def to_dict(self) -> dict:
        return {"path": self.path, "sha256": self.sha256, "bytes": self.bytes}


@dataclass(frozen=True)
class SampleRequest:
    json_file: str  # KServe v2 JSON body (Content-Type application/json)
    binary_file: str  # binary+json body
    binary_header_size: int

    @property
    def binary_content_type(self) -> str:
        return f"application/vnd.sagemaker-triton.binary+json;json-header-size={self.binary_header_size}"

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], where: str = "sample_request") -> "SampleRequest":
        return cls(str(required_field(data, "json_file", where)), str(required_field(data, "binary_file", where)),
                   int(required_field(data, "binary_header_size", where)))

    def to_dict(self) -> dict:
        return {"json_file": self.json_file, "binary_file": self.binary_file,
                "binary_header_size": self.binary_header_size, "binary_content_type": self.binary_content_type}


@dataclass(frozen=True)
class Source:
    """Where the weights came from: ``family`` (timm, huggingface), the requested ``name``,
    ``weights`` (pretrained | random | local), ``weights_path`` (local) or ``seed`` (random),
    then the family's own facts (``extra``: timm's pretrained tag, mean, std; the tokenizer...),
    written flat after the fixed keys."""

    family: str
    name: str
    weights: str
    weights_path: str | None = None
    seed: int | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)

    _KEYS = ("family", "name", "weights", "weights_path", "seed")

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], where: str = "source") -> "Source":
        return cls(
            family=str(required_field(data, "family", where)),
            name=str(required_field(data, "name", where)),
            weights=str(required_field(data, "weights", where)),
            weights_path=data.get("weights_path"),
            seed=data.get("seed"),
            extra=_rest(data, cls._KEYS),
        )

    def to_dict(self) -> dict:
        return {"family": self.family, "name": self.name, "weights": self.weights,
                "weights_path": self.weights_path, "seed": self.seed, **self.extra}


_TARGET_OPTIONAL = ("tensorrt", "cuda", "pytorch_container", "onnx_opset", "python", "torch", "torch_tensorrt",
                    "torch_tensorrt_abi", "min_compute_capability", "min_driver")


@dataclass(frozen=True)
class TritonTarget:
    """The serving release the artifact was made for (``mme.versions.Release.to_dict`` as
    recorded at package time: the file keeps it even when versions.toml changes later)."""

    release: str
    triton_container: str | None = None
    sagemaker_image: str | None = None
    triton_server: str | None = None
    tensorrt: str | None = None
    cuda: str | None = None
    pytorch_container: str | None = None
    onnx_opset: int | None = None
    python: str | None = None
    torch: str | None = None
    torch_tensorrt: str | None = None
    torch_tensorrt_abi: str | None = None
    min_compute_capability: str | None = None
    min_driver: str | None = None  # the NVIDIA driver the release's CUDA needs natively
    sagemaker: bool = False
    unverified: tuple[str, ...] = ()
    extra: Mapping[str, Any] = field(default_factory=dict)  # keys a newer mme may add

    _KEYS = ("release", "triton_container", "sagemaker_image", "triton_server", *_TARGET_OPTIONAL,
             "sagemaker", "unverified")

    @classmethod
    def from_release(cls, release: Any) -> "TritonTarget":
        """From a :class:`mme.versions.Release`."""
        return cls.from_dict(release.to_dict())

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], where: str = "triton.target") -> "TritonTarget":
        return cls(
            release=str(required_field(data, "release", where)),
            triton_container=data.get("triton_container"),
            sagemaker_image=data.get("sagemaker_image"),
            triton_server=data.get("triton_server"),
            **{key: data.get(key) for key in _TARGET_OPTIONAL},
            sagemaker=bool(data.get("sagemaker", False)),
            unverified=tuple(data.get("unverified") or ()),
            extra=_rest(data, cls._KEYS),
        )

    def to_dict(self) -> dict:
        data: dict[str, Any] = {"release": self.release, "triton_container": self.triton_container,
                                "sagemaker_image": self.sagemaker_image, "triton_server": self.triton_server}
        for key in _TARGET_OPTIONAL:
            if getattr(self, key) is not None:
                data[key] = getattr(self, key)
        data["sagemaker"] = self.sagemaker
        if self.unverified:
            data["unverified"] = list(self.unverified)
        return data | dict(self.extra)


@dataclass(frozen=True)
class TritonSettings:
    """How Triton serves the model: ``platform`` or ``backend``, ``max_batch_size``, the
    instance kind, dynamic batching, and the serving release it targets."""

    platform: str | None
    backend: str | None
    max_batch_size: int
    instance_kind: str | None
    dynamic_batching: bool | None
    target: TritonTarget | None = None  # None only in manifests older than release targets
    extra: Mapping[str, Any] = field(default_factory=dict)

    _KEYS = ("platform", "backend", "max_batch_size", "instance_kind", "dynamic_batching", "target")

    @property
    def release(self) -> str | None:
        """The target release's name (e.g. ``"25.09"``), None when none is recorded."""
        return self.target.release if self.target is not None else None

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], where: str = "triton") -> "TritonSettings":
        target = data.get("target") if isinstance(data, Mapping) else None
        return cls(
            platform=required_field(data, "platform", where),
            backend=data.get("backend"),
            max_batch_size=int(data.get("max_batch_size") or 0),
            instance_kind=data.get("instance_kind"),
            dynamic_batching=data.get("dynamic_batching"),
            target=TritonTarget.from_dict(target, f"{where}.target") if target else None,
            extra=_rest(data, cls._KEYS),
        )

    def to_dict(self) -> dict:
        data: dict[str, Any] = {"platform": self.platform, "backend": self.backend, "max_batch_size": self.max_batch_size,
                                "instance_kind": self.instance_kind, "dynamic_batching": self.dynamic_batching}
        if self.target is not None:
            data["target"] = self.target.to_dict()
        return data | dict(self.extra)


@dataclass(frozen=True)
class TensorEntry:
    """One model input or output as Triton and KServe v2 name it: ``datatype`` (KServe: FP32,
    INT64...), ``dims`` without the batch axis (-1: dynamic), ``axes`` (the dynamic axis'
    name per dim, None for fixed ones) and ``source_name`` (the framework's own name)."""

    name: str
    datatype: str
    dims: tuple[int, ...]
    axes: tuple[str | None, ...] | None = None
    source_name: str | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)

    _KEYS = ("name", "datatype", "dims", "axes", "source_name")

    @property
    def dim_axes(self) -> tuple[str | None, ...]:
        """The axis name of each dim (None where fixed or not recorded)."""
        return self.axes if self.axes is not None else (None,) * len(self.dims)

    @classmethod
    def from_spec(cls, spec: Any, source_name: str | None = None) -> "TensorEntry":
        """From a :class:`packager.spec.TensorSpec` (what the export takes or returns)."""
        return cls.from_dict(dict(spec.to_dict(), source_name=source_name))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], where: str = "inputs[]") -> "TensorEntry":
        axes = data.get("axes") if isinstance(data, Mapping) else None
        return cls(
            name=str(required_field(data, "name", where)),
            datatype=str(required_field(data, "datatype", where)),
            dims=tuple(int(d) for d in required_field(data, "dims", where)),
            axes=tuple(axes) if axes is not None else None,
            source_name=data.get("source_name"),
            extra=_rest(data, cls._KEYS),
        )

    def to_dict(self) -> dict:
        data: dict[str, Any] = {"name": self.name, "datatype": self.datatype, "dims": list(self.dims)}
        if self.axes is not None:
            data["axes"] = list(self.axes)
        if self.source_name is not None:
            data["source_name"] = self.source_name
        return data | dict(self.extra)


@dataclass(frozen=True)
class Validation:
    """The comparison with PyTorch: ``passed`` (None: not compared, ``skipped`` says why), the
    tolerance (an output passed where |export - PyTorch| <= ``atol`` + ``rtol`` x |PyTorch|
    elementwise; rtol absent in manifests written before it existed: absolute only), the
    largest absolute difference, the ``device`` the export ran on ("cpu" or "cuda"; absent:
    the CPU, before it was recorded) and the cases run (as
    ``packager.validate.ValidationReport.to_dict`` writes them)."""

    passed: bool | None
    atol: float | None = None
    max_abs_diff: float | None = None
    cases: tuple[Mapping[str, Any], ...] | None = None
    skipped: str | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)
    rtol: float | None = None
    device: str | None = None

    _KEYS = ("passed", "atol", "rtol", "max_abs_diff", "device", "cases", "skipped")

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], where: str = "validation") -> "Validation":
        data = object_field(data, where)
        cases = data.get("cases")
        device = data.get("device")
        if device is not None and not isinstance(device, str):
            raise ManifestFieldError(f"{where}.device is not a string")
        return cls(
            passed=data.get("passed"),
            atol=data.get("atol"),
            max_abs_diff=data.get("max_abs_diff"),
            cases=tuple(cases) if cases is not None else None,
            skipped=data.get("skipped"),
            extra=_rest(data, cls._KEYS),
            rtol=data.get("rtol"),
            device=device,
        )

    def to_dict(self) -> dict:
        data: dict[str, Any] = {"passed": self.passed}
        for key in ("atol", "rtol", "max_abs_diff", "device"):
            if getattr(self, key) is not None:
                data[key] = getattr(self, key)
        if self.cases is not None:
            data["cases"] = [dict(c) for c in self.cases]
        if self.skipped is not None:
            data["skipped"] = self.skipped
        return data | dict(self.extra)


def _histogram(value: Any) -> dict[str, int] | None:
    """A recorded ``{precision: layer count}`` (entries that are not counts left out); None when absent."""
    if not isinstance(value, Mapping):
        return None
    return {str(k): int(v) for k, v in value.items() if isinstance(v, int) and not isinstance(v, bool)}


class _Text:
    """A :class:`BuildDetails` key read as text (None when absent); the attribute's name is the key."""

    key = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.key = name

    def __get__(self, details: "BuildDetails | None", owner: type | None = None) -> str | None:
        return None if details is None else details._text(self.key)


@dataclass(frozen=True)
class BuildDetails:
    """``details``: what the export recorded of the build. Its keys depend on the format (the
    ONNX opset; TensorRT's version, precision, builder settings and GPU; the SageMaker job of a
    remote compile; ...), so they are kept as written, in order; the ones code reads are typed
    properties, absent ones None."""

    values: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None, where: str = "details") -> "BuildDetails":
        return cls(object_field(data, where))

    def to_dict(self) -> dict:
        return dict(self.values)

    def updated(self, **values: Any) -> "BuildDetails":
        return BuildDetails(dict(self.values) | values)

    def _text(self, key: str) -> str | None:
        value = self.values.get(key)
        return None if value is None else str(value)

    # The text-valued keys code reads, each a property named after its key.
    task = _Text()
    tensorrt = _Text()
    precision = _Text()
    engine_precision = _Text()
    hardware_compatibility = _Text()
    gpu = _Text()
    compute_capability = _Text()
    torch_tensorrt_abi = _Text()
    built_on = _Text()
    builder = _Text()
    training_job = _Text()

    @property
    def axes_max(self) -> dict[str, int]:
        """The largest length of each dynamic axis (sequence: 128); empty when none."""
        return {str(k): int(v) for k, v in (self.values.get("axes_max") or {}).items()}

    @property
    def opset(self) -> int | None:
        return self.values.get("opset")

    @property
    def layer_precisions(self) -> dict[str, int] | None:
        """A TensorRT plan's layers counted by their outputs' datatype, ``{"fp16": 120, "fp32": 9, "int32": 3}``
        (None: not recorded). The fields are defined in packager/formats/tensorrt_plan.py."""
        return _histogram(self.values.get("layer_precisions"))

    @property
    def compute_layer_precisions(self) -> dict[str, int] | None:
        """The same over the plan's compute layers, which ``engine_precision`` sums up (one precision, or
        ``mixed``). None in manifests written before it existed: their ``engine_precision`` is a majority vote."""
        return _histogram(self.values.get("compute_layer_precisions"))

    @property
    def builder_settings(self) -> dict[str, Any]:
        return dict(self.values.get("builder_settings") or {})
