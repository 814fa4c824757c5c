"""``mme package --with-tokenizer``: a Triton ensemble of the packaged WordPiece tokenizer and the
encoder, checked against Hugging Face's tokenizer and PyTorch on the same texts."""

from __future__ import annotations

import hashlib
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import BertConfig, BertModel, BertTokenizer, RobertaConfig, RobertaModel

from mme.errors import OutputValuesMismatchError, UsageError
from mme.progress import Reporter
from packager.backends.wordpiece_tokenizer import WordPieceTokenizer
from packager.text_ensemble import step_names
from packager.text_tokenizer import VALIDATION_TEXTS, TextTokenizer, built_in_vocab, check_tokenizer
from packager.triton_config import read_config
from serving.models.extract import extract_model_tarball
from tests.packager.conftest import load_manifest, run_cli

CONFIG = BertConfig(vocab_size=400, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=37,
                    max_position_embeddings=64)


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory) -> Path:
    """A tiny BERT saved without tokenizer files: the vocabulary is built in code."""
    path = tmp_path_factory.mktemp("bert") / "tiny-bert"
    torch.manual_seed(5)
    BertModel(CONFIG).save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def text_artifacts(tiny_bert, tmp_path_factory) -> Path:
    from mme.cli import main

    out = tmp_path_factory.mktemp("text-artifacts")
    code = main(["-q", "package", "tiny-bert", "--weights", str(tiny_bert), "--with-tokenizer", "--formats",
                 "onnx,cpu-local,torchscript", "--seq-len", "24", "--max-batch-size", "4", "--out", str(out)])
    assert code == 0
    return out / "tiny-bert"


def test_built_in_vocabulary_has_the_models_size_and_berts_layout():
    vocab = built_in_vocab(30522)
    assert len(vocab) == 30522 and len(set(vocab)) == 30522
    assert [vocab.index(t) for t in ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")] == [0, 100, 101, 102, 103]
    assert "happy" in vocab and "##e" in vocab and "!" in vocab
    small = built_in_vocab(400)
    assert len(small) == 400 and small[:104] == vocab[:104]
    with pytest.raises(UsageError, match="too small"):
        built_in_vocab(120)


def test_packaged_tokenizer_equals_hugging_faces_on_odd_texts():
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "hello", "world", "na", "##ive", "cafe", ",", "!", "中",
             "文", "x", "##x", "don", "'", "t"]
    ours = WordPieceTokenizer(vocab, max_length=12)
    theirs = BertTokenizer(vocab={t: i for i, t in enumerate(vocab)}, do_lower_case=True)
    texts = ["Hello, WORLD!", "naïve café", "中文 don't", "xxxx" * 40, "", "hello " * 20, "tab\tnew\nline\u00a0nb"]
    ids, mask = ours.encode(texts)
    want = theirs(texts, padding="max_length", truncation=True, max_length=12, return_tensors="np")
    np.testing.assert_array_equal(ids, want["input_ids"])
    np.testing.assert_array_equal(mask, want["attention_mask"])
    assert ours.token_ids("naïve") == [2, 7, 8, 3]  # accents stripped, ## continuation


def test_a_tokenizer_that_differs_from_the_reference_is_refused():
    vocab = built_in_vocab(400)
    cased_reference = BertTokenizer(vocab={t: i for i, t in enumerate(vocab)}, do_lower_case=False)
    tokenizer = TextTokenizer(vocab, "hub", "cased", 16, lowercase=True, reference=cased_reference)
    with pytest.raises(OutputValuesMismatchError, match=r"\[tokenizer\] input_ids of text 0 .* differs from Hugging Face's"):
        check_tokenizer(tokenizer, Reporter(quiet=True))


def test_text_artifact_is_an_ensemble_with_text_in(text_artifacts):
    for fmt, encoder_inputs in (("onnx", ["input_ids", "attention_mask"]), ("cpu-local", ["input_ids", "attention_mask"]),
                                ("torchscript", ["INPUT__0", "INPUT__1"])):
        directory = text_artifacts / fmt
        manifest = load_manifest(directory)
        assert [(t.name, t.datatype, t.dims) for t in manifest.inputs] == [("TEXT", "BYTES", (1,))]
        assert [(t.name, t.dims) for t in manifest.outputs] == [("last_hidden_state", (-1, 32)), ("pooler_output", (32,))]
        tokenizer = manifest.details.values["tokenizer"]
        assert tokenizer["vocabulary"] == "built-in" and tokenizer["vocab_size"] == 400
        assert "built in code" in tokenizer["note"] and tokenizer["max_length"] == 24
        inputs = [c["input"] for c in manifest.validation.cases]
        assert inputs.count("text") == 2 and inputs.count("token ids") == 2  # 8 texts in batches of 4
        assert manifest.validation.extra["tokenizer"]["token_ids_equal"] is True
        ensemble, (tokenizer_dir, encoder_dir) = manifest.model, step_names(manifest.model)
        config = read_config(directory / ensemble / "config.pbtxt")
        assert config.platform == "ensemble" and [s.model_name for s in config.ensemble_scheduling.step] == [
            tokenizer_dir, encoder_dir]
        assert sorted(config.ensemble_scheduling.step[1].input_map) == sorted(encoder_inputs)
        vocab = (directory / tokenizer_dir / "1" / "vocab.txt").read_text(encoding="utf-8").splitlines()
        assert len(vocab) == 400 and vocab[101] == "[CLS]"
        with tarfile.open(directory / manifest.tarball) as tar:
            tops = list(dict.fromkeys(m.name.split("/")[0] for m in tar.getmembers()))
        assert tops == [ensemble, tokenizer_dir, encoder_dir]
        extracted = extract_model_tarball(directory / manifest.tarball, directory.parent / f".x-{fmt}")
        assert extracted.layout == "ensemble" and extracted.models[0] == ensemble


def test_repackaging_gives_byte_identical_tarballs(text_artifacts, tiny_bert, tmp_path):
    from mme.cli import main

    code = main(["-q", "package", "tiny-bert", "--weights", str(tiny_bert), "--with-tokenizer", "--formats", "onnx",
                 "--seq-len", "24", "--max-batch-size", "4", "--out", str(tmp_path)])
    assert code == 0
    first = text_artifacts / "onnx" / "tiny-bert.tar.gz"
    again = tmp_path / "tiny-bert" / "onnx" / "tiny-bert.tar.gz"
    assert hashlib.sha256(first.read_bytes()).digest() == hashlib.sha256(again.read_bytes()).digest()


def test_the_models_own_tokenizer_is_packaged_when_it_is_there(tmp_path, capsys):
    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [chr(c) for c in range(97, 123)] + [
        "##" + chr(c) for c in range(97, 123)] + ["happy", "super", "now", "right", "am", ".", ",", "!"]
    model_dir = tmp_path / "own-tok"
    torch.manual_seed(1)
    BertModel(BertConfig(vocab_size=len(words) + 3, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                         intermediate_size=20, max_position_embeddings=40)).save_pretrained(model_dir)
    BertTokenizer(vocab={t: i for i, t in enumerate(words)}, do_lower_case=True).save_pretrained(model_dir)
    code, _, err = run_cli(capsys, "package", "own-tok", "--weights", str(model_dir), "--with-tokenizer",
                             "--formats", "onnx", "--seq-len", "16", "--out", str(tmp_path / "out"))
    assert code == 0, err
    directory = tmp_path / "out" / "own-tok" / "onnx"
    manifest = load_manifest(directory)
    assert manifest.details.values["tokenizer"]["vocabulary"] == "local"
    assert "note" not in manifest.details.values["tokenizer"]
    vocab = (directory / "own-tok-tokenizer" / "1" / "vocab.txt").read_text().splitlines()
    assert vocab == words
    assert f"{len(VALIDATION_TEXTS)} texts" in err and "ids and masks equal to BertTokenizer's" in err


@pytest.mark.parametrize("case", ["image-model", "bpe-without-tokenizer"])
def test_with_tokenizer_refusals_are_one_line_and_leave_nothing(case, tmp_path, capsys):
    out = tmp_path / "out"
    if case == "image-model":
        argv = ["package", "test_resnet", "--no-pretrained", "--with-tokenizer", "--formats", "onnx", "--out", str(out)]
        expected = "--with-tokenizer applies to Hugging Face text models"
    else:
        model_dir = tmp_path / "tiny-roberta"
        RobertaModel(RobertaConfig(vocab_size=300, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                   intermediate_size=20, max_position_embeddings=40)).save_pretrained(model_dir)
        argv = ["package", "tiny-roberta", "--weights", str(model_dir), "--with-tokenizer", "--formats", "onnx",
                "--seq-len", "16", "--out", str(out)]
        expected = "only a WordPiece vocabulary (BERT, DistilBERT) can be built in code"
    code, _, err = run_cli(capsys, *argv)
    assert code == 2
    errors = [line for line in err.splitlines() if "error:" in line]
    assert len(errors) == 1 and expected in errors[0] and "Traceback" not in err
    assert not out.exists() or not any(out.rglob("manifest.json"))
