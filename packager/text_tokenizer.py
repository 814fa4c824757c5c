"""The WordPiece tokenizer ``mme package --with-tokenizer`` packages (the text ensemble's first step):
the model's own tokenizer's vocabulary when one is at hand (hub or local directory), else one built
here with the model's vocabulary size, and the check that it gives Hugging Face's token ids on
:data:`VALIDATION_TEXTS` before anything is written. The ensemble itself is
:mod:`packager.text_ensemble`'s.
"""

from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from mme.errors import OutputValuesMismatchError, UsageError
from mme.progress import Reporter
from packager.backends.wordpiece_tokenizer import WordPieceTokenizer
from packager.model import LoadedModel

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


def text_tokenizer(model: LoadedModel) -> TextTokenizer:
    """The tokenizer to package for ``model``, or UsageError saying why there is none."""
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


def check_vocab_lines(vocab: tuple[str, ...]) -> None:
    """vocab.txt holds one token per line: a token with a line break cannot be written."""
    bad = [t for t in vocab if re.search(r"[\n\r]", t)]
    if bad:
        raise UsageError(f"--with-tokenizer: {len(bad)} vocabulary tokens contain line breaks ({bad[0]!r}); "
                         "they cannot be written to vocab.txt")

