"""manifest.json's typed records: the JSON they write, what they read back (older files
included), and the one-line errors of Manifest.load."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from mme.errors import MmeError
from mme.versions import release, releases
from packager.compat import EngineFacts
from packager.manifest import MANIFEST_NAME, Manifest
from packager.manifest_records import (
    BuildDetails,
    FileEntry,
    SampleRequest,
    Source,
    TensorEntry,
    TritonSettings,
    TritonTarget,
    Validation,
)


def a_manifest(**changes) -> Manifest:
    manifest = Manifest(
        model="bert_tiny",
        requested_name="org/bert-tiny",
        format="onnx",
        source=Source(family="huggingface", name="org/bert-tiny", weights="random", seed=0,
                      extra={"model_type": "bert", "vocab_size": 30522}),
        triton=TritonSettings(platform="onnxruntime_onnx", backend=None, max_batch_size=8, instance_kind="KIND_GPU",
                              dynamic_batching=True, target=TritonTarget.from_release(release("25.09"))),
        tarball="bert_tiny.tar.gz",
        files=(FileEntry("bert_tiny.tar.gz", "ab" * 32, 123),),
        parameters=4_000_000,
        inputs=(TensorEntry("input_ids", "INT64", (-1,), ("sequence",), "input_ids"),),
        outputs=(TensorEntry("last_hidden_state", "FP32", (-1, 32), ("sequence", None), "last_hidden_state"),),
        sample_request=SampleRequest("sample_request.json", "sample_request.bin", 120),
        versions={"mme-toolkit": "0.1.0", "onnx": "1.17.0"},
        validation=Validation(passed=True, atol=1e-4, max_abs_diff=2e-6,
                              cases=({"batch": 2, "axes": {"sequence": 32}, "outputs": []},)),
        timings_s={"load": 1.5, "export": 2.25},
        created_at="2026-01-01T00:00:00+00:00",
        details=BuildDetails({"opset": 18, "task": "feature-extraction", "axes_max": {"sequence": 32}}),
    )
    return replace(manifest, **changes)


def test_the_json_keeps_its_shape(tmp_path):
    manifest = a_manifest()
    manifest.write(tmp_path)
    data = manifest.to_dict()
    assert (tmp_path / MANIFEST_NAME).read_text() == json.dumps(data, indent=2) + "\n"
    assert list(data) == ["schema_version", "model", "requested_name", "format", "source", "triton", "tarball", "files",
                          "parameters", "inputs", "outputs", "sample_request", "versions", "validation", "timings_s",
                          "created_at", "details"]
    assert data["schema_version"] == 1
    assert data["source"] == {"family": "huggingface", "name": "org/bert-tiny", "weights": "random",
                              "weights_path": None, "seed": 0, "model_type": "bert", "vocab_size": 30522}
    assert list(data["triton"]) == ["platform", "backend", "max_batch_size", "instance_kind", "dynamic_batching", "target"]
    assert data["triton"]["target"] == release("25.09").to_dict()
    assert data["inputs"] == [{"name": "input_ids", "datatype": "INT64", "dims": [-1], "axes": ["sequence"],
                               "source_name": "input_ids"}]
    assert data["sample_request"]["binary_content_type"].endswith("json-header-size=120")
    assert list(data["validation"]) == ["passed", "atol", "max_abs_diff", "cases"]
    assert data["details"] == {"opset": 18, "task": "feature-extraction", "axes_max": {"sequence": 32}}
    assert Manifest.load(tmp_path) == manifest
    assert Manifest.load(tmp_path / MANIFEST_NAME) == manifest  # the file itself also does


@pytest.mark.parametrize("rel", releases(), ids=lambda r: r.name)
def test_the_target_writes_what_the_release_does(rel):
    target = TritonTarget.from_release(rel)
    assert json.dumps(target.to_dict()) == json.dumps(rel.to_dict())  # same keys, same order
    assert target.release == rel.name and target.tensorrt == rel.tensorrt


def test_typed_reads():
    manifest = a_manifest()
    assert manifest.weights == "random" and manifest.source.extra["model_type"] == "bert"
    assert manifest.triton.release == "25.09" and manifest.triton.target.sagemaker is True
    assert manifest.details.axes_max == {"sequence": 32} and manifest.details.task == "feature-extraction"
    assert manifest.details.compute_capability is None and manifest.details.builder_settings == {}
    assert manifest.outputs[0].dim_axes == ("sequence", None)
    assert TensorEntry("x", "FP32", (3, 4)).dim_axes == (None, None)
    assert manifest.validation.max_abs_diff == 2e-6
    facts = EngineFacts.of(a_manifest(format="tensorrt", versions={"tensorrt": "10.13.3.9"},
                                      details=BuildDetails({"compute_capability": "8.6", "hardware_compatibility": "none"})))
    assert (facts.format, facts.tensorrt, facts.compute_capability) == ("tensorrt", "10.13.3.9", "8.6")
    assert EngineFacts.of(facts) is facts
    assert EngineFacts.of(a_manifest().to_dict()) == EngineFacts.of(a_manifest())  # dicts of the same shape too


def test_a_skipped_validation_writes_only_what_it_has():
    validation = Validation(passed=None, skipped="built remotely")
    assert validation.to_dict() == {"passed": None, "skipped": "built remotely"}
    assert Validation.from_dict(validation.to_dict()) == validation


def test_older_and_newer_manifests_load(tmp_path):
    data = a_manifest().to_dict()
    del data["triton"]["target"]  # written before release targets
    data["triton"]["future"] = {"x": 1}  # keys a newer mme may add are kept
    data["inputs"][0].pop("axes")
    data["inputs"][0].pop("source_name")
    (tmp_path / MANIFEST_NAME).write_text(json.dumps(data))
    manifest = Manifest.load(tmp_path)
    assert manifest.triton.target is None and manifest.triton.release is None
    assert manifest.inputs[0].dim_axes == (None,) and manifest.inputs[0].source_name is None
    assert manifest.to_dict()["triton"]["future"] == {"x": 1}
    assert manifest.to_dict() == data


def test_load_errors_are_one_line(tmp_path):
    with pytest.raises(MmeError, match="no manifest.json in .*point at an artifact directory"):
        Manifest.load(tmp_path)
    path = tmp_path / MANIFEST_NAME
    data = a_manifest().to_dict()
    path.write_text(json.dumps(data | {"schema_version": 2}))
    with pytest.raises(MmeError, match="has schema version 2, this mme reads 1"):
        Manifest.load(tmp_path)
    del data["source"]["weights"]
    path.write_text(json.dumps(data))
    with pytest.raises(MmeError, match=r"is not a manifest this mme reads: source.weights is missing; re-run 'mme package'"):
        Manifest.load(tmp_path)
    path.write_text(json.dumps(a_manifest().to_dict() | {"files": [{"path": "x", "sha256": "y", "bytes": "many"}]}))
    with pytest.raises(MmeError, match="a field has the wrong kind") as info:
        Manifest.load(tmp_path)
    assert "\n" not in str(info.value)
