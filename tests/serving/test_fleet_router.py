"""mme serve --instances N: several local MMEs (each its own Triton and memory limit) behind a
router that sends a model's requests to an instance holding it, else to a random one, as the
fleet simulation assumes SageMaker does; real boto3 clients, real Triton servers."""

from __future__ import annotations

import shutil

import boto3
import pytest
import requests

from mme.errors import UsageError
from mme.progress import Reporter
from serving.runtime.fleet_router import INSTANCE_HEADER, LocalFleet, Router, merge_snapshots
from serving.runtime.local_endpoint import LocalEndpointOptions
from serving.runtime.reply_headers import COLD_HEADER


def test_requests_go_to_a_holder_else_to_a_random_instance():
    router = Router(["http://a", "http://b", "http://c"], seed=3)
    first = {router.choose("m")[0] for _ in range(60)}
    assert first == {0, 1, 2}, "nobody holds m: any instance"
    router.instances[1].loaded.add("m")
    assert {router.choose("m") for _ in range(20)} == {(1, True)}
    router.instances[2].loading["m"] = 1  # a load the router started there
    assert {router.choose("m")[0] for _ in range(40)} == {1, 2}
    router.instances[2].loading["m"] = 0
    assert {router.choose("m")[0] for _ in range(20)} == {1}


def test_snapshots_merge_as_one_endpoints():
    def snap(invocations, loads, loaded, util, lat):
        return {"schema_version": 1, "time": 5.0, "uptime_s": 4.0, "counts": {"Invocations": invocations, "ModelLoads": loads},
                "latency_us": {"ModelLatency": lat}, "gauges": {"LoadedModelCount": loaded, "MemoryUtilization": util},
                "loaded_models": [{"target": f"m{loaded}"}], "loading_models": []}

    merged = merge_snapshots([snap(10, 2, 1, 20.0, {"count": 4, "sum": 40.0, "min": 5.0, "max": 20.0}),
                              snap(6, 1, 2, 40.0, {"count": 0, "sum": 0.0, "min": None, "max": None})])
    assert merged["counts"] == {"Invocations": 16, "ModelLoads": 3} and merged["instance_count"] == 2
    assert merged["gauges"] == {"LoadedModelCount": 3, "MemoryUtilization": 30.0}
    assert merged["latency_us"]["ModelLatency"] == {"count": 4, "sum": 40.0, "min": 5.0, "max": 20.0, "avg": 10.0}
    assert [(m["target"], m["instance"]) for m in merged["loaded_models"]] == [("m1", 0), ("m2", 1)]
    assert merge_snapshots([]) == {}


@pytest.mark.parametrize("options, message", [
    ({"mode": "single"}, "leave --mode single out"),
    ({"require_signature": True, "access_key_id": "k", "secret_access_key": "s"}, "leave --require-signature out"),
])
def test_what_a_fleet_cannot_do_is_refused_in_one_line(tmp_path, options, message):
    with pytest.raises(UsageError, match=message):
        LocalFleet(LocalEndpointOptions(models=str(tmp_path), **options), 2)
    with pytest.raises(UsageError, match="between 1 and 16"):
        LocalFleet(LocalEndpointOptions(models=str(tmp_path)), 0)


@pytest.mark.integration
def test_two_instances_serve_each_model_where_it_is_loaded(packaged_test_resnet, tmp_path):
    models = tmp_path / "models"
    models.mkdir()
    shutil.copy(packaged_test_resnet.tarball, models / "test_resnet.tar.gz")
    options = LocalEndpointOptions(models=str(models), port=0, copies=6, server_kind="local", allow_unsigned=True)
    with LocalFleet(options, 2, Reporter(quiet=True), seed=1) as fleet:
        client = boto3.client("sagemaker-runtime", endpoint_url=fleet.url, region_name="us-east-1",
                              aws_access_key_id="test", aws_secret_access_key="test")
        body = packaged_test_resnet.sample("json")
        where: dict[str, set[str]] = {}
        cold = []
        for round_ in range(3):
            for copy in range(6):  # -v0 ... -v5
                target = f"test_resnet-v{copy}.tar.gz"
                reply = client.invoke_endpoint(EndpointName="local", TargetModel=target, ContentType="application/json",
                                               Body=body)
                headers = reply["ResponseMetadata"]["HTTPHeaders"]
                where.setdefault(target, set()).add(headers[INSTANCE_HEADER.lower()])
                cold.append((round_, headers[COLD_HEADER.lower()]))
        assert all(len(instances) == 1 for instances in where.values()), f"a model went to two instances: {where}"
        assert {i for s in where.values() for i in s} == {"0", "1"}, "six models on one instance out of two: not random"
        assert [c for r, c in cold if r == 0] == ["1"] * 6 and {c for r, c in cold if r > 0} == {"0"}
        loaded = requests.get(f"{fleet.url}/models", timeout=10).json()["models"]
        assert {(m["target"], str(m["instance"])) for m in loaded} == {(t, next(iter(s))) for t, s in where.items()}
        snapshot = requests.get(f"{fleet.url}/metrics.json", timeout=10).json()
        assert snapshot["counts"]["Invocations"] == 18 and snapshot["counts"]["ModelLoads"] == 6
        assert snapshot["instance_count"] == 2 and sum(snapshot["routed"]) == 18
        assert requests.get(f"{fleet.url}/targets", timeout=10).json()["targets"][:1] == ["test_resnet.tar.gz"]
    with pytest.raises(requests.ConnectionError):  # the router stopped with the instances
        requests.get(f"{fleet.url}/ping", timeout=2)
