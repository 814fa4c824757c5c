"""bench.request.BenchRequest: the typed request behind `mme bench`, built by the CLI and by
library callers (`mme demo`) alike."""

from __future__ import annotations

from dataclasses import fields, replace
from pathlib import Path

import pytest

from bench.request import (DEFAULTS, BenchRequest, EndpointOptions, FleetOptions, LoadOptions, PayloadOptions,
                           TargetOptions, build_bench_config)
from mme.cli import build_parser
from mme.errors import UsageError


def _parsed(*argv: str) -> BenchRequest:
    return BenchRequest.from_args(build_parser().parse_args(["bench", *argv]))


def _unreachable(mode: str = "multi") -> EndpointOptions:
    return EndpointOptions("e", "http://127.0.0.1:9", mode=mode)


def test_the_command_line_defaults_are_the_request_defaults() -> None:
    assert _parsed("--endpoint", "e") == BenchRequest(endpoint=EndpointOptions("e"))


def test_every_option_reaches_its_field() -> None:
    request = _parsed("--endpoint", "e", "--copies", "3", "--shape", "constant", "--users", "4", "--duration", "9",
                      "--wait", "0.1,0.2", "--client", "boto3", "--max-p95-ms", "250", "--run-id", "r1", "--seed", "7")
    load = request.load
    assert (request.targets.copies, load.shape, load.users, load.duration) == (3, "constant", 4, 9.0)
    assert (load.wait, request.client.kind, request.stops.max_p95_ms, request.output.run_id,
            request.targets.seed) == ((0.1, 0.2), "boto3", 250.0, "r1", 7)
    options = {f.metadata.get("option", f.name)
               for group in fields(BenchRequest) for f in fields(getattr(request, group.name))}
    assert options >= {"endpoint", "quiet"}
    assert DEFAULTS.load.wait == (0.05, 0.5)


@pytest.mark.parametrize("change, message", [
    ({"payload": PayloadOptions(artifact="a", file="p")}, "not both"),
    ({"payload": PayloadOptions(binary=True)}, "needs --artifact"),
    ({"endpoint": _unreachable("single"), "targets": TargetOptions(copies=2)}, "--mode single sends no TargetModel"),
    ({"endpoint": _unreachable("multi")}, "needs a request body"),
])
def test_a_library_caller_gets_the_same_one_line_errors(change: dict, message: str) -> None:
    with pytest.raises(UsageError, match=message):
        build_bench_config(BenchRequest(**{"endpoint": _unreachable(), **change}), "", Path())


def test_the_master_port_defaults_to_the_workers_default_when_remote_workers_are_expected() -> None:
    from bench.config import WORKER_MASTER_PORT
    from tests.bench.fake_endpoint import FakeEndpoint

    assert _parsed("--endpoint", "e").generators.master_port is None
    assert _parsed("--endpoint", "e", "--master-port", "6000").generators.master_port == 6000
    assert build_parser().parse_args(["bench-worker", "--master-host", "h"]).master_port == WORKER_MASTER_PORT
    with FakeEndpoint() as endpoint:
        request = BenchRequest(endpoint=EndpointOptions("e", endpoint.url, mode="single"))
        assert build_bench_config(request, "r", Path()).generators.master_port == 0  # local workers only: any free port
        remote = build_bench_config(replace(request, generators=replace(request.generators, expect_workers=1)), "r", Path())
        assert remote.generators.master_port == WORKER_MASTER_PORT


def test_in_process_needs_an_artifact_that_onnx_runtime_runs(tmp_path, test_resnet_cpu_local) -> None:
    directory, _ = test_resnet_cpu_local
    with pytest.raises(UsageError, match="--in-process runs the artifact's model in this process: it needs --artifact"):
        build_bench_config(BenchRequest(endpoint=_unreachable("single"), load=LoadOptions(in_process=1.0)), "", Path())
    torchscript = tmp_path / "torchscript"
    torchscript.mkdir()
    manifest = (directory / "manifest.json").read_text().replace('"format": "cpu-local"', '"format": "torchscript"')
    (torchscript / "manifest.json").write_text(manifest)
    with pytest.raises(UsageError, match="is torchscript: use an artifact in one of onnx, cpu-local"):
        build_bench_config(BenchRequest(endpoint=_unreachable(), payload=PayloadOptions(artifact=str(torchscript)),
                                  load=LoadOptions(in_process=1.0)), "", Path())
    assert _parsed("--endpoint", "e", "--in-process", "5").load.in_process == 5.0


def test_in_process_baseline_runs_the_artifacts_model_on_its_sample(test_resnet_cpu_local) -> None:
    from bench.in_process import measure_in_process
    from mme.progress import Reporter

    directory, _ = test_resnet_cpu_local
    result = measure_in_process(directory, 0.5, Reporter(quiet=True))
    assert result.requests >= 1 and result.requests_per_s > 0 and result.p95_ms >= result.p50_ms > 0
    assert result.pipeline == "model" and result.runtime.startswith("onnxruntime ")


FLEET = FleetOptions(mix="zipf:1.1", catalogue="fleet.toml")


@pytest.mark.parametrize("change, message", [
    ({"fleet": FleetOptions(mix="zipf:1.1")}, "--mix needs --catalogue FILE"),
    ({"fleet": FleetOptions(catalogue="fleet.toml")}, "--catalogue goes with --mix"),
    ({"fleet": FLEET, "targets": TargetOptions(copies=3)}, "leave --copies out"),
    ({"fleet": FLEET, "endpoint": _unreachable("single")}, "leave --mode single out"),
])
def test_a_mix_refuses_what_does_not_go_with_it(change: dict, message: str) -> None:
    with pytest.raises(UsageError, match=message):
        build_bench_config(BenchRequest(**{"endpoint": _unreachable(), **change}), "", Path())


def test_a_mixs_weights_pick_targets_in_proportion() -> None:
    from bench.targets import Distribution, TargetPicker

    picker = TargetPicker(("a", "b", "c"), Distribution("uniform"), seed=3, weights=(6.0, 3.0, 1.0))
    picks = [picker.pick() for _ in range(20_000)]
    shares = [picks.count(name) / len(picks) for name in ("a", "b", "c")]
    assert shares == pytest.approx([0.6, 0.3, 0.1], abs=0.015)
    assert picker.probabilities() == pytest.approx((0.6, 0.3, 0.1))
    with pytest.raises(UsageError, match="one weight per target"):
        TargetPicker(("a", "b"), Distribution("uniform"), weights=(1.0,))


def test_the_config_crosses_processes_as_json_and_comes_back_the_same_typed_value() -> None:
    from bench.config import BenchConfig
    from bench.config import InProcessResult
    from bench.config import MixPlan
    from bench.payload import Payload
    from tests.bench.fake_endpoint import FakeEndpoint

    with FakeEndpoint() as endpoint:
        config = build_bench_config(BenchRequest(endpoint=EndpointOptions("e", endpoint.url, mode="single"),
                                           load=LoadOptions(shape="constant", users=2, duration=3.0)), "r", Path("/x"))
    binary = Payload(bytes(range(256)), "application/octet-stream", "a.bin", "m", "onnx")
    mix = MixPlan(("a.tar.gz", "b.tar.gz"), (2.0, 1.0), (binary, config.payload), ("a", "b"), "zipf:1.1", "fleet.toml")
    config = replace(config, targets=replace(config.targets, names=mix.targets, mix=mix),
                     in_process=InProcessResult(10, 1.0, 10.0, 1.5, 2.5, "onnxruntime", "model", "sample"))
    text = config.to_json()
    assert BenchConfig.from_json(text) == config
    assert "\\u0000" not in text and "base64" not in text  # bodies are base64 strings, not escaped bytes


def test_peak_users_scales_the_staged_shape_and_fits_no_other() -> None:
    assert _parsed("--endpoint", "e", "--peak-users", "40").load.peak_users == 40
    request = BenchRequest(endpoint=_unreachable("single"), payload=PayloadOptions(file=__file__, content_type="text/plain"),
                           load=LoadOptions(shape="constant", users=2, duration=3, peak_users=40))
    with pytest.raises(UsageError, match="--peak-users scales the staged shape"):
        build_bench_config(request, "", Path())
    with pytest.raises(UsageError, match="multiple of 20"):
        build_bench_config(replace(request, load=LoadOptions(peak_users=50)), "", Path())


@pytest.mark.parametrize("command", ["bench", "demo", "demo-realtime"])
def test_a_peak_that_is_not_a_multiple_of_20_is_refused_before_anything_runs(command: str, tmp_path, capsys) -> None:
    from mme.cli import main

    out = tmp_path / "artifacts"
    extra = ["--endpoint", "e"] if command == "bench" else ["--out", str(out), "--results", str(tmp_path / "r")]
    assert main([command, *extra, "--peak-users", "30"]) == 2
    assert "--peak-users: must be a multiple of 20" in capsys.readouterr().err
    assert not out.exists() and not (tmp_path / "r").exists()  # nothing packaged, nothing measured
