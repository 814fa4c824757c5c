"""Triton python-backend model: text in (BYTES), BERT WordPiece token ids out.

Written by ``mme package --with-tokenizer`` as ``<model>_tokenizer/1/model.py`` with the
vocabulary as ``vocab.txt`` next to it: the first step of the text ensemble, whose second step
is the encoder. Standard library and numpy only, so it runs on the SageMaker Triton image as
shipped (which has no transformers or tokenizers). It does what Hugging Face's BERT tokenizer
does (``BertNormalizer`` + ``BertPreTokenizer`` + ``WordPiece`` + ``[CLS] ... [SEP]``), and
``mme package`` checks it against that tokenizer on the same texts before it is packaged.
Settings (vocabulary file, lower-casing, length, special tokens) come from config.pbtxt.
Every text is padded to ``max_length``, so the encoder's dynamic batcher can batch requests.
"""

import json
import os
import unicodedata

import numpy as np

# CJK Unified Ideographs blocks: Hugging Face puts spaces around these characters.
_CJK = ((0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0x2A700, 0x2B73F), (0x2B740, 0x2B81F),
        (0x2B820, 0x2CEAF), (0xF900, 0xFAFF), (0x2F800, 0x2FA1F))


def _is_control(char):
    return char not in "\t\n\r" and unicodedata.category(char).startswith("C")


def _is_whitespace(char):
    return char in " \t\n\r" or unicodedata.category(char) == "Zs" or char.isspace()


def _is_punctuation(char):
    code = ord(char)
    if 33 <= code <= 47 or 58 <= code <= 64 or 91 <= code <= 96 or 123 <= code <= 126:
        return True
    return unicodedata.category(char).startswith("P")


def _is_cjk(char):
    code = ord(char)
    return any(low <= code <= high for low, high in _CJK)


class WordPieceTokenizer:
    """BERT's tokenizer: normalise, split on whitespace and punctuation, greedy longest-match
    WordPiece with ``##`` continuations, ``[CLS] tokens [SEP]``, truncated and padded to
    ``max_length``."""

    def __init__(self, vocab, max_length, lowercase=True, strip_accents=None, unk_token="[UNK]",
                 cls_token="[CLS]", sep_token="[SEP]", pad_token="[PAD]", max_chars_per_word=100):
        self.vocab = {token: index for index, token in enumerate(vocab)}
        if max_length < 2:
            raise ValueError("max_length must leave room for [CLS] and [SEP]")
        missing = [t for t in (unk_token, cls_token, sep_token, pad_token) if t not in self.vocab]
        if missing:
            raise ValueError("the vocabulary lacks " + ", ".join(missing))
        self.max_length = int(max_length)
        self.lowercase = bool(lowercase)
        self.strip_accents = self.lowercase if strip_accents is None else bool(strip_accents)
        self.unk_id = self.vocab[unk_token]
        self.cls_id = self.vocab[cls_token]
        self.sep_id = self.vocab[sep_token]
        self.pad_id = self.vocab[pad_token]
        self.max_chars_per_word = max_chars_per_word

    @classmethod
    def from_file(cls, path, **settings):
        with open(path, encoding="utf-8") as handle:
            vocab = [line.rstrip("\n") for line in handle]
        while vocab and vocab[-1] == "":
            vocab.pop()
        return cls(vocab, **settings)

    @classmethod
    def from_parameters(cls, version_dir, params):
        """As config.pbtxt's ``parameters`` (string values) set it up, vocab.txt in ``version_dir``."""
        strip = params.get("strip_accents", "")
        return cls.from_file(
            os.path.join(version_dir, params.get("vocab_file", "vocab.txt")),
            max_length=int(params["max_length"]),
            lowercase=params.get("lowercase", "true") == "true",
            strip_accents=None if strip == "" else strip == "true",
            unk_token=params.get("unk_token", "[UNK]"),
            cls_token=params.get("cls_token", "[CLS]"),
            sep_token=params.get("sep_token", "[SEP]"),
            pad_token=params.get("pad_token", "[PAD]"),
        )

    def normalize(self, text):
        chars = []
        for char in text:
            if char in "\x00\ufffd" or _is_control(char):
                continue
            if _is_whitespace(char):
                chars.append(" ")
            elif _is_cjk(char):
                chars.extend((" ", char, " "))
            else:
                chars.append(char)
        text = "".join(chars)
        if self.strip_accents:
            text = "".join(c for c in unicodedata.normalize("NFD", text) if unicodedata.category(c) != "Mn")
        if self.lowercase:
            text = text.lower()
        return text

    def words(self, text):
        """Whitespace-separated words with every punctuation character on its own."""
        out = []
        for word in text.split():
            current = []
            for char in word:
                if _is_punctuation(char):
                    if current:
                        out.append("".join(current))
                        current = []
                    out.append(char)
                else:
                    current.append(char)
            if current:
                out.append("".join(current))
        return out

    def wordpiece(self, word):
        if len(word) > self.max_chars_per_word:
            return [self.unk_id]
        ids, start = [], 0
        while start < len(word):
            end, found = len(word), None
            while start < end:
                piece = word[start:end] if start == 0 else "##" + word[start:end]
                if piece in self.vocab:
                    found = self.vocab[piece]
                    break
                end -= 1
            if found is None:
                return [self.unk_id]
            ids.append(found)
            start = end
        return ids

    def token_ids(self, text):
        ids = []
        for word in self.words(self.normalize(text)):
            ids.extend(self.wordpiece(word))
        return [self.cls_id] + ids[: self.max_length - 2] + [self.sep_id]

    def encode(self, texts):
        """``input_ids`` and ``attention_mask`` (int64, ``[len(texts), max_length]``)."""
        input_ids = np.full((len(texts), self.max_length), self.pad_id, dtype=np.int64)
        mask = np.zeros((len(texts), self.max_length), dtype=np.int64)
        for row, text in enumerate(texts):
            ids = self.token_ids(text)
            input_ids[row, : len(ids)] = ids
            mask[row, : len(ids)] = 1
        return input_ids, mask


def _text(value):
    return value.decode("utf-8", errors="replace") if isinstance(value, bytes) else str(value)


class TritonPythonModel:
    def initialize(self, args):
        import triton_python_backend_utils as pb_utils

        config = json.loads(args["model_config"])
        params = {k: v.get("string_value", "") for k, v in config.get("parameters", {}).items()}
        version_dir = os.path.join(args["model_repository"], args["model_version"])
        self.tokenizer = WordPieceTokenizer.from_parameters(version_dir, params)
        self.input_name = config["input"][0]["name"]
        self.ids_name, self.mask_name = (o["name"] for o in config["output"])
        self.pb_utils = pb_utils

    def execute(self, requests):
        pb_utils = self.pb_utils
        responses = []
        for request in requests:
            try:
                values = pb_utils.get_input_tensor_by_name(request, self.input_name).as_numpy()
                texts = [_text(v) for v in values.reshape(values.shape[0], -1)[:, 0]]
                ids, mask = self.tokenizer.encode(texts)
                responses.append(pb_utils.InferenceResponse(output_tensors=[
                    pb_utils.Tensor(self.ids_name, ids), pb_utils.Tensor(self.mask_name, mask)]))
            except Exception as exc:  # one bad request must not fail the others in the batch
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(f"tokenizer: {exc}")))
        return responses

    def finalize(self):
        self.tokenizer = None
