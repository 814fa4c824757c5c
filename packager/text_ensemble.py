"""Text in: ``mme package <text model> --with-tokenizer`` packages a Triton ensemble of a
tokenizer step and the encoder step, so clients send text (one BYTES tensor, ``TEXT``) and get
the encoder's outputs.

The tokenizer step is ``packager/backends/wordpiece_tokenizer.py`` (python backend, standard
library and numpy only: the SageMaker Triton image has no transformers) with the model's
vocabulary as ``vocab.txt``. The vocabulary is the model's own tokenizer's when one is at hand
(hub or local directory); with random weights and no hub it is built here with the model's
vocabulary size, and the manifest says so (:mod:`packager.text_tokenizer`). Before anything is
written the packaged tokenizer is checked against Hugging Face's tokenizer (token ids equal on
``VALIDATION_TEXTS``), and the whole ensemble (tokenizer + the exported encoder, in-process)
against PyTorch on the same texts. :class:`TextEnsemble` is what the pipeline calls for it
(:mod:`packager.served`).

Per artifact directory (one ensemble plus its steps, a valid MME tarball too)::

    <name>/config.pbtxt, <name>/1/            the ensemble: TEXT -> the encoder's outputs
    <name>-tokenizer/1/model.py, vocab.txt     text -> input_ids, attention_mask
    <name>-encoder/1/model.<ext>               the exported encoder, in the chosen format
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

import numpy as np

from mme.errors import UsageError
from mme.fsutil import write_bytes_atomic
from mme.progress import Reporter
from packager import layout
from packager.formats.base import ExportedModel, Runner
from packager.model import LoadedModel
from packager.registry import FAMILIES, ModelFamily
from packager.sources.hf_source import SAMPLE_TEXT  # the second article's payload
from packager.spec import IOSpec, TensorSpec
from packager.text_tokenizer import (
    VALIDATION_TEXTS,
    VOCAB_FILE,
    TextTokenizer,
    check_tokenizer,
    reference_tokenizer,
    text_tokenizer,
)
from packager.triton_config import write_config
from packager.triton_options import TritonOptions
from packager.validate import ReferenceCase, reference_cases, validate

if TYPE_CHECKING:  # the generated module's types; at run time the schema packager.model_config chose
    from tritonclient.grpc import model_config_pb2 as mc
else:
    from packager.model_config import mc

TEXT = TensorSpec("TEXT", "bytes", (1,))
TOKENIZER_PY = "wordpiece_tokenizer.py"


@dataclass(frozen=True)
class TextReferences:
    """PyTorch's outputs the ensemble's exports are validated against: on token ids and on text."""

    token_ids: tuple[ReferenceCase, ...]
    text: tuple[ReferenceCase, ...]


def step_names(name: str) -> tuple[str, str]:
    """The ensemble's tokenizer and encoder model directories."""
    return f"{name}-tokenizer", f"{name}-encoder"


def tokenizer_source() -> Path:
    return Path(str(resources.files("packager.backends").joinpath(TOKENIZER_PY)))


def check_text_family(name: str, family: ModelFamily) -> None:
    """UsageError unless ``family`` supports a tokenizer (checked before the model is loaded)."""
    if not family.source.supports_tokenizer:
        text = " or ".join(f.title for f in FAMILIES if f.source.supports_tokenizer) or "no"
        raise UsageError(f"--with-tokenizer applies to {text} text models; {name} is a {family.name} model, "
                         "whose inputs are not text")


def text_spec(spec: IOSpec) -> IOSpec:
    """The ensemble's I/O: TEXT in, the encoder's outputs (by their spec names) out."""
    return dataclasses.replace(spec, inputs=(TEXT,))


def text_array(texts: list[str] | tuple[str, ...]) -> np.ndarray:
    """Texts as the TEXT tensor: ``[len(texts), 1]`` UTF-8 bytes."""
    return np.array([[t.encode("utf-8")] for t in texts], dtype=object).reshape(len(texts), 1)


def reference_text_cases(model: LoadedModel, tokenizer: TextTokenizer, max_batch: int) -> tuple[ReferenceCase, ...]:
    """PyTorch's outputs for the validation texts, tokenized by Hugging Face, in batches of at
    most ``max_batch``."""
    import torch

    hf = reference_tokenizer(tokenizer)
    size = max(1, min(max_batch, 4))
    cases = []
    for start in range(0, len(VALIDATION_TEXTS), size):
        texts = list(VALIDATION_TEXTS[start:start + size])
        enc = hf(texts, padding="max_length", truncation=True, max_length=tokenizer.max_length, return_tensors="np")
        args = [torch.from_numpy(np.asarray(enc[t.name], dtype=np.int64)) for t in model.spec.inputs]
        with torch.no_grad():
            out = model.module(*args)
        out = out if isinstance(out, (tuple, list)) else (out,)
        outputs = {t.name: o.detach().float().numpy() for t, o in zip(model.spec.outputs, out)}
        cases.append(ReferenceCase(len(texts), {"sequence": tokenizer.max_length}, {TEXT.name: text_array(texts)},
                                   outputs))
    return tuple(cases)


def served_model(spec: IOSpec, encoder: ExportedModel) -> ExportedModel:
    """What the ensemble takes and returns (the manifest's inputs and outputs)."""
    outputs = tuple(dataclasses.replace(e, name=s.name) for s, e in zip(spec.outputs, encoder.outputs))
    return ExportedModel(format=encoder.format, files={}, inputs=(TEXT,), outputs=outputs, details=encoder.details)


def text_runner(tokenizer: TextTokenizer, spec: IOSpec, encoder: ExportedModel, run: Runner) -> Runner:
    """The ensemble in-process: the packaged tokenizer, then the exported encoder."""
    ours = tokenizer.build()
    feeds = [(s.name, e.name) for s, e in zip(spec.inputs, encoder.inputs)]
    renames = {e.name: s.name for s, e in zip(spec.outputs, encoder.outputs)}

    def runner(inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        texts = [v.decode("utf-8") if isinstance(v, bytes) else str(v) for v in inputs[TEXT.name][:, 0]]
        ids, mask = ours.encode(texts)
        arrays = {"input_ids": ids, "attention_mask": mask}
        got = run({exported: arrays[name] for name, exported in feeds})
        return {renames.get(k, k): v for k, v in got.items()}

    return runner


def tokenizer_config(tokenizer: TextTokenizer, options: TritonOptions) -> mc.ModelConfig:
    config = mc.ModelConfig(backend="python", max_batch_size=options.max_batch_size)
    entry = config.input.add(name=TEXT.name, data_type=mc.TYPE_STRING)
    entry.dims.extend(TEXT.triton_dims)
    for name in ("input_ids", "attention_mask"):
        out = config.output.add(name=name, data_type=mc.TYPE_INT64)
        out.dims.append(tokenizer.max_length)
    if options.dynamic_batching:
        config.dynamic_batching.max_queue_delay_microseconds = options.max_queue_delay_us
    config.instance_group.add(count=options.instance_count, kind=mc.ModelInstanceGroup.KIND_CPU)
    for key, value in tokenizer.parameters().items():
        config.parameters[key].string_value = value
    return config


def ensemble_config(spec: IOSpec, encoder: ExportedModel, name: str, max_batch_size: int) -> mc.ModelConfig:
    """TEXT -> ``<name>-tokenizer`` -> input_ids, attention_mask -> ``<name>-encoder`` -> outputs."""
    tokenizer_name, encoder_name = step_names(name)
    config = mc.ModelConfig(platform="ensemble", max_batch_size=max_batch_size)
    entry = config.input.add(name=TEXT.name, data_type=mc.TYPE_STRING)
    entry.dims.extend(TEXT.triton_dims)
    for source, exported in zip(spec.outputs, encoder.outputs):
        out = config.output.add(name=source.name, data_type=mc.DataType.Value(exported.triton_dtype))
        out.dims.extend(exported.triton_dims)
    first = config.ensemble_scheduling.step.add(model_name=tokenizer_name, model_version=-1)
    first.input_map[TEXT.name] = TEXT.name
    second = config.ensemble_scheduling.step.add(model_name=encoder_name, model_version=-1)
    for source, exported in zip(spec.inputs, encoder.inputs):
        first.output_map[source.name] = source.name
        second.input_map[exported.name] = source.name
    for source, exported in zip(spec.outputs, encoder.outputs):
        second.output_map[exported.name] = source.name
    return config


def write_tokenizer_directory(root: Path, name: str, tokenizer: TextTokenizer, options: TritonOptions) -> Path:
    model_dir = root / name
    (model_dir / layout.VERSION).mkdir(parents=True)
    write_config(tokenizer_config(tokenizer, options), model_dir / "config.pbtxt")
    layout.place_file(tokenizer_source(), model_dir / layout.VERSION / "model.py")
    write_bytes_atomic(model_dir / layout.VERSION / VOCAB_FILE, ("\n".join(tokenizer.vocab) + "\n").encode("utf-8"))
    return model_dir


@dataclass(frozen=True)
class TextEnsemble:
    """What ``mme package --with-tokenizer`` serves (a :class:`packager.served.ServedModel`): the
    tokenizer, checked once against Hugging Face's, and per format the ensemble's validation
    (on token ids and on text), layout and manifest details."""

    tokenizer: TextTokenizer
    check: Mapping[str, Any]

    @classmethod
    def check_family(cls, name: str, family: ModelFamily) -> None:
        check_text_family(name, family)

    @classmethod
    def for_model(cls, model: LoadedModel, reporter: Reporter, timings: dict[str, float]) -> "TextEnsemble":
        with reporter.stage("tokenizer: check against Hugging Face's", timings, "tokenizer"):
            tokenizer = text_tokenizer(model)
            where = ("vocabulary built in code with the model's size (no tokenizer at hand)"
                     if tokenizer.origin == "built-in" else f"from {tokenizer.source}")
            reporter.info(f"  tokenizer: WordPiece, {len(tokenizer.vocab)} tokens, {where}, "
                          f"lower-case {tokenizer.lowercase}, padded to {tokenizer.max_length}")
            return cls(tokenizer, check_tokenizer(tokenizer, reporter))

    def references(self, model: LoadedModel, max_batch: int) -> TextReferences:
        return TextReferences(reference_cases(model, max_batch), reference_text_cases(model, self.tokenizer, max_batch))

    def validate(self, model: LoadedModel, encoder: ExportedModel, run: Runner, references: TextReferences, *,
                 atol: float, rtol: float, device: str, device_detail: str, reporter: Reporter) -> dict[str, Any]:
        """The encoder on token ids, then the ensemble (packaged tokenizer + this export) on the
        validation texts, both against PyTorch with the same atol and rtol: one record."""
        ids = validate(model, encoder, run, references.token_ids, atol, reporter, rtol=rtol, device=device,
                       device_detail=device_detail).to_dict()
        served = dataclasses.replace(served_model(model.spec, encoder), format=f"{encoder.format} + tokenizer, text")
        text = validate(dataclasses.replace(model, spec=text_spec(model.spec)), served,
                        text_runner(self.tokenizer, model.spec, encoder, run), references.text, atol, reporter,
                        rtol=rtol, device=device).to_dict()
        cases = [dict(c, input="token ids") for c in ids.get("cases", ())]
        cases += [dict(c, input="text") for c in text["cases"]]
        return dict(ids, cases=cases, tokenizer=dict(self.check),
                    max_abs_diff=max(float(ids.get("max_abs_diff") or 0.0), text["max_abs_diff"]))

    def layout(self, root: Path, name: str, model: LoadedModel, encoder: ExportedModel, encoder_config: mc.ModelConfig,
               options: TritonOptions) -> tuple[layout.Served, tuple[str, ...]]:
        """The ensemble, its steps and the text sample request under ``root``: (what it serves, the
        steps' directories, which the tarball holds after the ensemble)."""
        tokenizer_name, encoder_name = step_names(name)
        layout.write_model_directory(root, encoder_name, encoder, encoder_config)
        write_tokenizer_directory(root, tokenizer_name, self.tokenizer, options)
        (root / name / layout.VERSION).mkdir(parents=True)
        write_config(ensemble_config(model.spec, encoder, name, options.max_batch_size), root / name / "config.pbtxt")
        served = served_model(model.spec, encoder)
        sample = layout.write_sample_arrays(root, [(TEXT, text_array([SAMPLE_TEXT]))], served)
        return layout.Served(text_spec(model.spec), served, sample), (tokenizer_name, encoder_name)

    def details(self, name: str) -> dict[str, Any]:
        """The manifest's ``details`` keys of the text ensemble."""
        tokenizer_name, encoder_name = step_names(name)
        return {"text_input": {"ensemble": name, "steps": [tokenizer_name, encoder_name], "sample_text": SAMPLE_TEXT},
                "tokenizer": self.tokenizer.to_dict()}
