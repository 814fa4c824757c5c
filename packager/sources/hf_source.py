"""Hugging Face transformers encoders (BERT, RoBERTa, DistilBERT, ...) with their tokenizer.

Inputs are ``input_ids`` and ``attention_mask`` (int64, dynamic batch and sequence);
outputs are ``last_hidden_state`` and, where the architecture has a pooler,
``pooler_output``. Known models carry a configuration built in code, so they package
with random weights (``--no-pretrained``) without reaching the hub.
"""

from __future__ import annotations

import fnmatch
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

import numpy as np

from mme.errors import UsageError, WeightsUnavailableError
from mme.progress import Reporter
from packager.formats.base import package_version
from packager.model import LoadedModel, ModelRequest
from packager.spec import IOSpec, TensorSpec
from packager.weights import load_with_weights

if TYPE_CHECKING:
    import numpy as np

FAMILY = "huggingface"
DEFAULT_SEQ_LEN = 128
SAMPLE_TEXT = "I am super happy right now."  # the second article's payload
# Files that hold a tokenizer's vocabulary (fast or slow, WordPiece or BPE).
TOKENIZER_FILES = ("tokenizer.json", "vocab.txt", "vocab.json", "spiece.model", "sentencepiece.bpe.model")

_BERT_LARGE = dict(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, intermediate_size=4096)
_ROBERTA = dict(
    vocab_size=50265, max_position_embeddings=514, type_vocab_size=1,
    pad_token_id=1, bos_token_id=0, eos_token_id=2, layer_norm_eps=1e-5,
)
# name -> (model_type, config overrides on top of that type's defaults), matching the
# published config.json of each checkpoint.
BUILTIN_CONFIGS: dict[str, tuple[str, dict[str, Any]]] = {
    "bert-base-uncased": ("bert", {}),
    "bert-base-cased": ("bert", {"vocab_size": 28996}),
    "bert-large-uncased": ("bert", dict(_BERT_LARGE)),
    "roberta-base": ("roberta", dict(_ROBERTA)),
    "roberta-large": ("roberta", dict(_ROBERTA, **_BERT_LARGE)),
    "distilbert-base-uncased": ("distilbert", {}),
    "distilroberta-base": ("roberta", dict(_ROBERTA, num_hidden_layers=6)),
    # 4.4M parameters: the smallest published BERT (Turc et al.), quick to package, serve and load-test
    "prajjwal1/bert-tiny": ("bert", dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=2,
                                         intermediate_size=512)),
}
ALIASES = {
    "google-bert/bert-base-uncased": "bert-base-uncased",
    "google-bert/bert-base-cased": "bert-base-cased",
    "google-bert/bert-large-uncased": "bert-large-uncased",
    "FacebookAI/roberta-base": "roberta-base",
    "FacebookAI/roberta-large": "roberta-large",
    "distilbert/distilbert-base-uncased": "distilbert-base-uncased",
    "distilbert/distilroberta-base": "distilroberta-base",
}


def versions() -> dict[str, str]:
    """The library this family loads models with, as the manifest records it."""
    return {"transformers": package_version("transformers") or "unknown"}


def list_models(pattern: str | None = None) -> list[str]:
    names = sorted(BUILTIN_CONFIGS)
    return [n for n in names if pattern is None or fnmatch.fnmatch(n, pattern)]


def owns(name: str) -> bool:
    return name in BUILTIN_CONFIGS or name in ALIASES or "/" in name


def owns_path(path: Path) -> bool:
    return path.is_dir() and (path / "config.json").is_file()


def _builtin_config(name: str):
    from transformers import AutoConfig

    model_type, overrides = BUILTIN_CONFIGS[ALIASES.get(name, name)]
    return AutoConfig.for_model(model_type, **overrides)


class _Encoder:
    """Builds the export wrapper lazily so importing this module stays cheap."""

    @staticmethod
    def wrap(model):
        import torch

        class EncoderOutputs(torch.nn.Module):
            def __init__(self, inner, with_pooler: bool):
                super().__init__()
                self.inner = inner
                self.with_pooler = with_pooler

            def forward(self, input_ids, attention_mask):
                out = self.inner(input_ids=input_ids, attention_mask=attention_mask)
                if self.with_pooler:
                    return out.last_hidden_state, out.pooler_output
                return out.last_hidden_state

        with torch.no_grad():
            ids = torch.ones(1, 4, dtype=torch.long)
            probe = model(input_ids=ids, attention_mask=torch.ones_like(ids))
        with_pooler = getattr(probe, "pooler_output", None) is not None
        return EncoderOutputs(model, with_pooler).eval(), with_pooler


class _NoLossWarning(logging.Filter):
    """transformers warns "`loss_type=None` was set in the config but it is unrecognized" when
    anything reads an encoder's ``loss_function`` (torch.jit.trace looks at every attribute).
    An export computes no loss: the line only alarms users."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "loss_type=" not in record.getMessage()


_NO_LOSS_WARNING = _NoLossWarning()


def load(request: ModelRequest, reporter: Reporter) -> LoadedModel:
    import torch
    from transformers import AutoConfig, AutoModel

    name = request.name
    logging.getLogger("transformers.modeling_utils").addFilter(_NO_LOSS_WARNING)  # once: filters are a set

    def random_model():
        torch.manual_seed(request.seed)
        if ALIASES.get(name, name) in BUILTIN_CONFIGS:
            config = _builtin_config(name)
        else:
            try:
                config = AutoConfig.from_pretrained(name)
            except Exception:
                raise WeightsUnavailableError(
                    f"no built-in configuration for {name!r} and its config.json is not reachable; "
                    "pass --weights DIR with a local copy of the model, or use a known model (mme package --list)"
                ) from None
        return AutoModel.from_config(config)

    def local_model():
        path = Path(request.weights_path)
        if path.is_dir():
            return AutoModel.from_pretrained(str(path))
        model = random_model()
        state = _load_state_dict(path)
        missing, unexpected = model.load_state_dict(state, strict=False)
        if missing or unexpected:
            raise ValueError(f"{len(missing)} missing and {len(unexpected)} unexpected keys")
        return model

    model, weights = load_with_weights(
        request,
        reporter,
        pretrained=lambda: AutoModel.from_pretrained(name),
        random=random_model,
        local=local_model,
    )
    model.eval()
    tokenizer = _tokenizer(name, request, weights)
    config = model.config
    max_positions = int(getattr(config, "max_position_embeddings", 512) or 512)
    if getattr(config, "model_type", "") in ("roberta", "xlm-roberta", "camembert"):
        max_positions -= 2  # RoBERTa positions start after the padding index
    seq_len = request.seq_len or min(DEFAULT_SEQ_LEN, max_positions)
    if seq_len > max_positions:

        raise UsageError(f"--seq-len {seq_len} exceeds {name}'s {max_positions} positions; use --seq-len {max_positions} or less")
    module, with_pooler = _Encoder.wrap(model)
    hidden = int(getattr(config, "hidden_size", getattr(config, "dim", 0)))
    outputs = [TensorSpec("last_hidden_state", "float32", ("sequence", hidden))]
    if with_pooler:
        outputs.append(TensorSpec("pooler_output", "float32", (hidden,)))
    spec = IOSpec(
        task="feature-extraction",
        inputs=(
            TensorSpec("input_ids", "int64", ("sequence",)),
            TensorSpec("attention_mask", "int64", ("sequence",)),
        ),
        outputs=tuple(outputs),
        axis_max=(("sequence", seq_len),),
        default_atol=1e-4,
    )
    vocab = int(config.vocab_size)

    def make_inputs(batch: int, axes: Mapping[str, int], seed: int) -> dict[str, np.ndarray]:
        length = axes["sequence"]
        if tokenizer is not None:
            texts = [SAMPLE_TEXT + " " + "More text to fill the sequence. " * i for i in range(batch)]
            enc = tokenizer(texts, padding="max_length", truncation=True, max_length=length, return_tensors="np")
            return {"input_ids": enc["input_ids"].astype(np.int64), "attention_mask": enc["attention_mask"].astype(np.int64)}
        rng = np.random.default_rng(seed)
        ids = rng.integers(low=min(999, vocab - 1), high=vocab, size=(batch, length), dtype=np.int64)
        mask = np.ones((batch, length), dtype=np.int64)
        for row in range(1, batch):  # rows of different lengths exercise the mask
            mask[row, max(1, length - row * length // (2 * batch)):] = 0
        return {"input_ids": ids, "attention_mask": mask}

    return LoadedModel(
        request=request,
        family=FAMILY,
        module=module,
        spec=spec,
        make_inputs=make_inputs,
        weights=weights,
        parameters=sum(p.numel() for p in model.parameters()),
        details={
            "model_type": getattr(config, "model_type", None),
            "tokenizer": getattr(tokenizer, "name_or_path", None) if tokenizer is not None else None,
            "vocab_size": vocab,
        },
        tokenizer=tokenizer,
    )


def _tokenizer(name: str, request: ModelRequest, weights: str):
    from transformers import AutoTokenizer

    local = weights == "local" and request.weights_path is not None and Path(request.weights_path).is_dir()
    source = str(request.weights_path) if local else name
    if local and not any((Path(source) / f).is_file() for f in TOKENIZER_FILES):
        return None  # transformers 5 would make a placeholder of the special tokens alone
    try:
        tokenizer = AutoTokenizer.from_pretrained(source)
    except Exception:
        return None  # no tokenizer here: sample inputs use random token ids
    if len(tokenizer.get_vocab()) <= len(tokenizer.all_special_tokens):
        return None  # a placeholder without a vocabulary, not the model's tokenizer
    return tokenizer


def _load_state_dict(path: Path) -> dict:
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        return load_file(str(path))
    import torch

    state = torch.load(str(path), map_location="cpu", weights_only=True)
    return state.get("state_dict", state) if isinstance(state, dict) else state


class HuggingFaceSource:
    """Hugging Face encoders as a family of :mod:`packager.registry` (its ``ModelSource``)."""

    supports_tokenizer = True  # text models: --with-tokenizer packages their WordPiece tokenizer
    open_names = True  # any name may be a hub id, beyond the built-in configurations listed
    featured: tuple[str, ...] = ()  # --list shows every built-in name

    def list_models(self, pattern: str | None = None) -> list[str]:
        return list_models(pattern)

    def owns(self, name: str) -> bool:
        return owns(name)

    def owns_path(self, path: Path) -> bool:
        return owns_path(path)

    def load(self, request: ModelRequest, reporter: Reporter) -> LoadedModel:
        return load(request, reporter)

    def versions(self) -> dict[str, str]:
        return versions()
