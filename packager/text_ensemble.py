"""Text in: ``mme package <text model> --with-tokenizer`` packages a Triton ensemble of a
tokenizer step and the encoder step, so clients send text (one BYTES tensor, ``TEXT``) and get
the encoder's outputs.

The tokenizer step is ``packager/backends/wordpiece_tokenizer.py`` (python backend, standard
library and numpy only: the SageMaker Triton image has no transformers) with the model's
vocabulary as ``vocab.txt``. The vocabulary is the model's own tokenizer's when one is at hand
(hub or local directory); with random weights and no hub it is built here with the model's
vocabulary size, and the manifest says so. Before anything is written the packaged tokenizer is
checked against Hugging Face's tokenizer (token ids equal on :data:`VALIDATION_TEXTS`), and the
whole ensemble (tokenizer + the exported encoder, in-process) against PyTorch on the same texts.

Per artifact directory (one ensemble plus its steps, a valid MME tarball too)::

    <name>/config.pbtxt, <name>/1/            the ensemble: TEXT -> the encoder's outputs
    <name>-tokenizer/1/model.py, vocab.txt     text -> input_ids, attention_mask
    <name>-encoder/1/model.<ext>               the exported encoder, in the chosen format
"""

from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

import numpy as np

from mme.errors import OutputValuesMismatchError, UsageError
from mme.progress import Reporter
from packager.backends.wordpiece_tokenizer import WordPieceTokenizer
from packager.formats.base import ExportedModel, Runner
from packager.model import LoadedModel
from packager.sources.hf_source import SAMPLE_TEXT  # the second article's payload
from packager.spec import IOSpec, TensorSpec
from packager.triton_config import TritonOptions
from packager.validate import ReferenceCase

if TYPE_CHECKING:  # the generated module's types; at run time the schema packager.model_config chose
    from tritonclient.grpc import model_config_pb2 as mc
else:
    from packager.model_config import mc

TEXT = TensorSpec("TEXT", "bytes", (1,))
TOKENIZER_PY = "wordpiece_tokenizer.py"
VOCAB_FILE = "vocab.txt"
SPECIALS = {"pad": "[PAD]", "unk": "[UNK]", "cls": "[CLS]", "sep": "[SEP]", "mask": "[MASK]"}
# What the packaged tokenizer is checked on: the article's payload, accents and case, every kind of
# whitespace, CJK, punctuation runs, words the vocabulary lacks, an over-long word, an empty text,
# and a text longer than the sequence (truncation).
VALIDATION_TEXTS = (
    "I am super happy right now.",
    "Héllo, WÖRLD!! Naïve café -- don't stop; 3.14159 is π.",
    "Tabs\tand\nnew lines\r\n  and\u00a0odd\u2003spaces\u200b",
    "中文字符 and 日本語 mixed in, 한국어 too",
    "Symbols ©®™ emoji 🙂 and control\x07chars",
    "x" * 120,
    "",
    " ".join(["The quick brown fox jumps over the lazy dog."] * 40),
)
# Common English words for the vocabulary built in code: enough that the article's sample text and
# ordinary sentences split into words rather than characters.
_WORDS = (
    "the of and to a in is it you that he was for on are with as i his they be at one have this from or had by "
    "not word but what some we can out other were all there when up use your how said an each she which do their "
    "time if will way about many then them write would like so these her long make thing see him two has look "
    "more day could go come did number sound no most people my over know water than call first who may down side "
    "been now find any new work part take get place made live where after back little only round man year came "
    "show every good me give our under name very through just form sentence great think say help low line "
    "differ turn cause much mean before move right boy old too same tell does set three want air well also play "
    "small end put home read hand port large spell add even land here must big high such follow act why ask men "
    "change went light kind off need house picture try us again animal point mother world near build self earth "
    "father head stand own page should country found answer school grow study still learn plant cover food sun "
    "four between state keep eye never last let thought city tree cross farm hard start might story saw far sea "
    "draw left late run don while press close night real life few north happy super am text quick brown fox "
    "jumps lazy dog stop model endpoint request"
).split()


@dataclass(frozen=True)
class TextTokenizer:
    """The WordPiece tokenizer the ensemble packages: vocabulary, settings, and where it came from."""

    vocab: tuple[str, ...]
    origin: str  # "hub" | "local" | "built-in"
    source: str  # the tokenizer's name or path, or how it was built
    max_length: int
    lowercase: bool
    strip_accents: bool | None = None  # None: as lowercase (Hugging Face's default)
    special: Mapping[str, str] = dataclasses.field(default_factory=lambda: dict(SPECIALS))
    reference: Any = None  # the Hugging Face tokenizer it is checked against

    def build(self) -> WordPieceTokenizer:
        return WordPieceTokenizer(list(self.vocab), max_length=self.max_length, lowercase=self.lowercase,
                                  strip_accents=self.strip_accents, unk_token=self.special["unk"],
                                  cls_token=self.special["cls"], sep_token=self.special["sep"],
                                  pad_token=self.special["pad"])

    def parameters(self) -> dict[str, str]:
        """config.pbtxt ``parameters`` the tokenizer's model.py reads."""
        params = {"vocab_file": VOCAB_FILE, "max_length": str(self.max_length), "lowercase": str(self.lowercase).lower(),
                  "unk_token": self.special["unk"], "cls_token": self.special["cls"], "sep_token": self.special["sep"],
                  "pad_token": self.special["pad"]}
        if self.strip_accents is not None:  # unset: as lowercase
            params["strip_accents"] = str(self.strip_accents).lower()
        return params

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"kind": "wordpiece", "vocabulary": self.origin, "source": self.source,
                                "vocab_size": len(self.vocab), "lowercase": self.lowercase,
                                "strip_accents": self.strip_accents, "max_length": self.max_length,
                                "padding": "max_length", "special_tokens": dict(self.special)}
        if self.origin == "built-in":
            data["note"] = ("vocabulary built in code with the model's vocabulary size (no tokenizer at hand): "
                            "token ids are not the published model's; use it with random weights")
        return data


def step_names(name: str) -> tuple[str, str]:
    """The ensemble's tokenizer and encoder model directories."""
    return f"{name}-tokenizer", f"{name}-encoder"


def tokenizer_source() -> Path:
    return Path(str(resources.files("packager.backends").joinpath(TOKENIZER_PY)))


def check_text_family(name: str, family: str) -> None:
    """UsageError unless ``family`` has text models (checked before the model is loaded)."""
    if family != "huggingface":
        raise UsageError(f"--with-tokenizer applies to Hugging Face text models; {name} is a {family} model, "
                         "whose inputs are not text")


def text_tokenizer(model: LoadedModel) -> TextTokenizer:
    """The tokenizer to package for ``model``, or UsageError saying why there is none."""
    check_text_family(model.request.name, model.family)
    max_length = model.spec.axes["sequence"]
    vocab_size = int(model.details.get("vocab_size") or 0)
    hf = model.tokenizer
    if hf is not None:
        return _from_hugging_face(model, hf, max_length, vocab_size)
    model_type = str(model.details.get("model_type") or "")
    if model_type not in ("bert", "distilbert"):
        raise UsageError(f"--with-tokenizer: {model.request.name} ({model_type or 'unknown type'}) has no tokenizer "
                         "here and only a WordPiece vocabulary (BERT, DistilBERT) can be built in code; pass "
                         "--weights DIR with the model's tokenizer files")
    name = model.request.name.lower()
    lowercase = "uncased" in name or "cased" not in name
    return TextTokenizer(built_in_vocab(vocab_size), "built-in", "built in code", max_length,
                         lowercase)


def _from_hugging_face(model: LoadedModel, hf: Any, max_length: int, vocab_size: int) -> TextTokenizer:
    name = model.request.name
    try:
        state = json.loads(hf.backend_tokenizer.to_str())
    except AttributeError:
        raise UsageError(f"--with-tokenizer: {name}'s tokenizer is not a Hugging Face fast tokenizer; only WordPiece "
                         "tokenizers (BERT, DistilBERT) can be packaged") from None
    kind = (state.get("model") or {}).get("type")
    normalizer = state.get("normalizer") or {}
    pre = (state.get("pre_tokenizer") or {}).get("type")
    words = state.get("model") or {}
    if (kind != "WordPiece" or normalizer.get("type") != "BertNormalizer" or pre != "BertPreTokenizer"
            or words.get("continuing_subword_prefix") != "##" or not normalizer.get("clean_text", True)
            or not normalizer.get("handle_chinese_chars", True)):
        raise UsageError(f"--with-tokenizer: {name}'s tokenizer is {kind or 'unknown'} with {normalizer.get('type')}; "
                         "the packaged tokenizer implements BERT's WordPiece only (bert-*, distilbert-*)")
    by_id = sorted((index, token) for token, index in hf.get_vocab().items())
    if [index for index, _ in by_id] != list(range(len(by_id))):
        raise UsageError(f"--with-tokenizer: {name}'s vocabulary ids are not contiguous from 0; it cannot be written "
                         "as vocab.txt")
    if vocab_size and len(by_id) > vocab_size:
        raise UsageError(f"--with-tokenizer: {name}'s tokenizer has {len(by_id)} tokens but the model embeds "
                         f"{vocab_size}; use the model's own tokenizer")
    special = {"pad": hf.pad_token, "unk": hf.unk_token, "cls": hf.cls_token, "sep": hf.sep_token,
               "mask": hf.mask_token or SPECIALS["mask"]}
    if None in special.values():
        raise UsageError(f"--with-tokenizer: {name}'s tokenizer lacks a special token ({special}); BERT's "
                         "[CLS] ... [SEP] with [PAD] and [UNK] is needed")
    check_vocab_lines(tuple(t for _, t in by_id))
    origin = "local" if model.weights == "local" else "hub"
    return TextTokenizer(tuple(t for _, t in by_id), origin, str(getattr(hf, "name_or_path", name) or name),
                         max_length, bool(normalizer.get("lowercase", True)), normalizer.get("strip_accents"),
                         special, reference=hf)


def built_in_vocab(vocab_size: int) -> tuple[str, ...]:
    """A WordPiece vocabulary of exactly ``vocab_size`` entries in BERT's id layout: [PAD] 0,
    [unused0-98] 1-99, [UNK] [CLS] [SEP] [MASK] 100-103, then characters, ``##`` characters,
    common words, and [unusedN] up to the size."""
    head = ["[PAD]"] + [f"[unused{i}]" for i in range(99)] + ["[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    chars = [chr(c) for c in range(33, 127)] + [chr(c) for c in range(0xC0, 0x100) if chr(c).isalpha()]
    chars = list(dict.fromkeys(chars))
    body = chars + ["##" + c for c in chars if c.isalnum()] + [w for w in dict.fromkeys(_WORDS) if len(w) > 1]
    if vocab_size < len(head) + 40:
        raise UsageError(f"--with-tokenizer: a vocabulary of {vocab_size} entries is too small for a WordPiece "
                         f"vocabulary built in code (at least {len(head) + 40}); pass --weights DIR with the model's tokenizer")
    vocab = head + body[: vocab_size - len(head)]
    vocab += [f"[unused{99 + i}]" for i in range(vocab_size - len(vocab))]
    return tuple(vocab)


def reference_tokenizer(tokenizer: TextTokenizer) -> Any:
    """Hugging Face's tokenizer for the packaged vocabulary: the model's own when there is one."""
    if tokenizer.reference is not None:
        return tokenizer.reference
    from transformers import BertTokenizer

    special = tokenizer.special
    return BertTokenizer(vocab={t: i for i, t in enumerate(tokenizer.vocab)}, do_lower_case=tokenizer.lowercase,
                         strip_accents=tokenizer.strip_accents, unk_token=special["unk"], sep_token=special["sep"],
                         pad_token=special["pad"], cls_token=special["cls"], mask_token=special["mask"])


def check_tokenizer(tokenizer: TextTokenizer, reporter: Reporter) -> dict[str, Any]:
    """Token ids of the packaged tokenizer equal Hugging Face's on every validation text, or
    OutputValuesMismatchError naming the first text and position that differ."""
    ours = tokenizer.build()
    theirs = reference_tokenizer(tokenizer)
    mine_ids, mine_mask = ours.encode(list(VALIDATION_TEXTS))
    enc = theirs(list(VALIDATION_TEXTS), padding="max_length", truncation=True, max_length=tokenizer.max_length,
                 return_tensors="np")
    for row, text in enumerate(VALIDATION_TEXTS):
        for name, mine, want in (("input_ids", mine_ids[row], enc["input_ids"][row]),
                                 ("attention_mask", mine_mask[row], enc["attention_mask"][row])):
            if not np.array_equal(mine, want):
                at = int(np.flatnonzero(mine != want)[0])
                raise OutputValuesMismatchError(
                    f"[tokenizer] {name} of text {row} ({text[:30]!r}) differs from Hugging Face's at position {at} "
                    f"({int(mine[at])} vs {int(want[at])}); the packaged tokenizer cannot stand in for this one")
    tokens = int(mine_mask.sum())
    reporter.info(f"    [tokenizer] {len(VALIDATION_TEXTS)} texts, {tokens} tokens: ids and masks equal to "
                  f"{type(theirs).__name__}'s ({tokenizer.origin} vocabulary, {len(tokenizer.vocab)} entries)  ok")
    return {"texts": len(VALIDATION_TEXTS), "tokens": tokens, "token_ids_equal": True,
            "reference": f"transformers {type(theirs).__name__}"}


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
    from mme.fsutil import write_bytes_atomic
    from packager.layout import VERSION, place_file
    from packager.triton_config import write_config

    model_dir = root / name
    (model_dir / VERSION).mkdir(parents=True)
    write_config(tokenizer_config(tokenizer, options), model_dir / "config.pbtxt")
    place_file(tokenizer_source(), model_dir / VERSION / "model.py")
    write_bytes_atomic(model_dir / VERSION / VOCAB_FILE, ("\n".join(tokenizer.vocab) + "\n").encode("utf-8"))
    return model_dir


def check_vocab_lines(vocab: tuple[str, ...]) -> None:
    """vocab.txt holds one token per line: a token with a line break cannot be written."""
    bad = [t for t in vocab if re.search(r"[\n\r]", t)]
    if bad:
        raise UsageError(f"--with-tokenizer: {len(bad)} vocabulary tokens contain line breaks ({bad[0]!r}); "
                         "they cannot be written to vocab.txt")


@dataclass(frozen=True)
class TextEnsemble:
    """One model's text packaging, shared by every format of a ``mme package --with-tokenizer`` run:
    the tokenizer (checked once against Hugging Face's) and, per format, the ensemble's
    validation, layout and manifest details."""

    tokenizer: TextTokenizer
    check: Mapping[str, Any]

    @classmethod
    def for_model(cls, model: LoadedModel, reporter: Reporter) -> "TextEnsemble":
        tokenizer = text_tokenizer(model)
        where = ("vocabulary built in code with the model's size (no tokenizer at hand)"
                 if tokenizer.origin == "built-in" else f"from {tokenizer.source}")
        reporter.info(f"  tokenizer: WordPiece, {len(tokenizer.vocab)} tokens, {where}, "
                      f"lower-case {tokenizer.lowercase}, padded to {tokenizer.max_length}")
        return cls(tokenizer, check_tokenizer(tokenizer, reporter))

    def references(self, model: LoadedModel, max_batch: int) -> tuple[ReferenceCase, ...]:
        return reference_text_cases(model, self.tokenizer, max_batch)

    def validate(self, model: LoadedModel, encoder: ExportedModel, run: Runner, references: tuple[ReferenceCase, ...],
                 atol: float, reporter: Reporter, encoder_validation: Mapping[str, Any],
                 rtol: float = 0.0) -> dict[str, Any]:
        """The ensemble (packaged tokenizer + this export) against PyTorch on the validation texts,
        merged with the encoder's own validation on token ids (the same atol and rtol)."""
        from packager.validate import validate

        spec = text_spec(model.spec)
        served = dataclasses.replace(served_model(model.spec, encoder), format=f"{encoder.format} + tokenizer, text")
        report = validate(dataclasses.replace(model, spec=spec), served,
                          text_runner(self.tokenizer, model.spec, encoder, run), references, atol, reporter,
                          rtol=rtol, device=str(encoder_validation.get("device", "cpu")))
        text = report.to_dict()
        cases = [dict(c, input="token ids") for c in encoder_validation.get("cases", ())]
        cases += [dict(c, input="text") for c in text["cases"]]
        return dict(encoder_validation, cases=cases, tokenizer=dict(self.check),
                    max_abs_diff=max(float(encoder_validation.get("max_abs_diff") or 0.0), text["max_abs_diff"]))

    def layout(self, root: Path, name: str, model: LoadedModel, encoder: ExportedModel, encoder_config: mc.ModelConfig,
               options: TritonOptions) -> tuple[Any, tuple[str, ...]]:
        """The ensemble, its steps and the text sample request under ``root``: (what it serves, the
        steps' directories, which the tarball holds after the ensemble)."""
        from packager import layout
        from packager.triton_config import write_config

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
