"""Hugging Face encoders: text inputs with dynamic batch and sequence, configs built in code."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
import torch
from transformers import AutoModel, BertConfig, BertModel, DistilBertConfig, DistilBertModel

from packager.sources.hf_source import BUILTIN_CONFIGS, _builtin_config
from tests.packager.conftest import load_manifest, run_cli

TINY = {
    "tiny-bert": (BertModel, BertConfig(vocab_size=1000, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                        intermediate_size=37, max_position_embeddings=64), True),
    "tiny-distilbert": (DistilBertModel, DistilBertConfig(vocab_size=1000, dim=32, n_layers=2, n_heads=2, hidden_dim=37,
                                                          max_position_embeddings=64), False),
}


@pytest.fixture(scope="module")
def tiny_text_artifacts(tmp_path_factory):
    base = tmp_path_factory.mktemp("text")
    out = base / "artifacts"
    for name, (cls, config, _) in TINY.items():
        torch.manual_seed(3)
        cls(config).save_pretrained(base / name)
        code = run_cli_plain("-q", "package", name, "--weights", str(base / name), "--seq-len", "32",
                             "--max-batch-size", "4", "--out", str(out))
        assert code == 0
    return base, out


def run_cli_plain(*argv: str) -> int:
    from mme.cli import main

    return main(list(argv))


@pytest.mark.parametrize("name", TINY)
def test_text_spec_and_manifest(tiny_text_artifacts, name):
    base, out = tiny_text_artifacts
    _, _, has_pooler = TINY[name]
    manifest = load_manifest(out / name / "onnx")
    assert manifest.source.weights == "local"
    assert manifest.source.family == "huggingface"
    assert [(i.name, i.datatype, i.dims) for i in manifest.inputs] == [
        ("input_ids", "INT64", (-1,)), ("attention_mask", "INT64", (-1,))]
    assert [i.axes for i in manifest.inputs] == [("sequence",), ("sequence",)]
    outputs = [(o.name, o.dims) for o in manifest.outputs]
    expected = [("last_hidden_state", (-1, 32))] + ([("pooler_output", (32,))] if has_pooler else [])
    assert outputs == expected
    assert manifest.details.axes_max == {"sequence": 32}
    cases = manifest.validation.cases
    assert [(c["batch"], c["axes"]["sequence"]) for c in cases] == [(2, 32), (1, 9)]
    ts = load_manifest(out / name / "torchscript")
    assert [i.name for i in ts.inputs] == ["INPUT__0", "INPUT__1"]


@pytest.mark.parametrize("name", TINY)
def test_onnx_runs_at_other_batch_and_length_and_matches_local_weights(tiny_text_artifacts, name):
    base, out = tiny_text_artifacts
    session = ort.InferenceSession(str(out / name / "onnx" / name / "1" / "model.onnx"), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    ids = rng.integers(5, 1000, size=(3, 11), dtype=np.int64)
    mask = np.ones_like(ids)
    mask[2, 7:] = 0
    got = session.run(["last_hidden_state"], {"input_ids": ids, "attention_mask": mask})[0]
    model = AutoModel.from_pretrained(str(base / name)).eval()
    with torch.no_grad():
        want = model(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask)).last_hidden_state.numpy()
    np.testing.assert_allclose(got, want, atol=1e-4)


def test_sample_request_is_text_shaped(tiny_text_artifacts):
    _, out = tiny_text_artifacts
    import json

    body = json.loads((out / "tiny-bert" / "cpu-local" / "sample_request.json").read_text())
    assert [(i["name"], i["datatype"], i["shape"]) for i in body["inputs"]] == [
        ("input_ids", "INT64", [1, 32]), ("attention_mask", "INT64", [1, 32])]


@pytest.mark.parametrize(
    "name, params",
    [("bert-base-uncased", 109_482_240), ("distilbert-base-uncased", 66_362_880), ("roberta-large", 355_359_744)],
)
def test_builtin_configs_match_the_published_models(name, params):
    with torch.device("meta"):
        model = AutoModel.from_config(_builtin_config(name))
    assert sum(p.numel() for p in model.parameters()) == params


@pytest.mark.integration
def test_named_model_packages_without_the_hub(tmp_path, capsys):
    """distilbert-base-uncased from its configuration built in code, random weights."""
    assert "distilbert-base-uncased" in BUILTIN_CONFIGS
    code, _, err = run_cli(capsys, "package", "distilbert-base-uncased", "--no-pretrained", "--formats", "onnx",
                           "--seq-len", "64", "--out", str(tmp_path))
    assert code == 0, err
    manifest = load_manifest(tmp_path / "distilbert-base-uncased" / "onnx")
    assert manifest.parameters == 66_362_880
    assert manifest.source.weights == "random"
    assert "last_hidden_state" in err and "max |diff|" in err


def test_seq_len_beyond_positions_is_refused(tiny_text_artifacts, tmp_path, capsys):
    base, _ = tiny_text_artifacts
    code, _, err = run_cli(capsys, "package", "tiny-bert", "--weights", str(base / "tiny-bert"), "--seq-len", "100",
                           "--out", str(tmp_path))
    assert code == 2
    assert "--seq-len 100 exceeds" in err.splitlines()[-1]


def test_a_text_export_says_its_inputs_plainly_and_no_loss_warning(tmp_path, capfd):
    """transformers' "`loss_type=None` ... unrecognized" line (torch.jit.trace reads the encoder's
    loss_function) is not shown: an export computes no loss. Dynamic axes are named plainly."""
    import logging

    from mme.cli import main

    seen: list[str] = []

    class Seen(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record.getMessage())

    logger = logging.getLogger("transformers.modeling_utils")
    handler = Seen()
    logger.addHandler(handler)
    try:
        code = main(["package", "distilbert-base-uncased", "--no-pretrained", "--formats", "torchscript",
                     "--seq-len", "32", "--out", str(tmp_path)])
    finally:
        logger.removeHandler(handler)
    captured = capfd.readouterr()
    assert code == 0, captured.err
    assert "inputs input_ids[sequence], attention_mask[sequence]" in captured.err
    assert not [m for m in seen if "loss_type" in m], seen
