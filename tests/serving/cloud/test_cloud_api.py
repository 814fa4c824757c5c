"""The local SageMaker's pieces that need no server: SageMaker's wire format checked against
botocore's service model, List* paging, the CloudWatch publication of one interval, moto's
statistics with percentiles, the image and instance-type lookups."""

from __future__ import annotations

import datetime as dt
import json
import time

import pytest

from mme.aws.images import release_of_image, triton_image_uri
from mme.instances import load_instances, memory_of_gpu
from mme.stats import percentile
from mme.versions import release
from serving.cloud import api
from serving.cloud.cloudwatch import enable_percentiles, metric_data
from serving.deploy.cloudwatch import INSTANCE_NS, SAGEMAKER_NS
from serving.cloud.control_plane import OPERATIONS, _page
from serving.runtime.metrics import EndpointMetrics, RequestSample

AUTH = "AWS4-HMAC-SHA256 Credential=AKID/20261206/eu-west-1/sagemaker/aws4_request, SignedHeaders=host, Signature=x"


def _parse(operation: str, params: dict) -> api.ApiRequest:
    return api.parse(f"SageMaker.{operation}", json.dumps(params).encode(), AUTH, OPERATIONS)


def test_a_valid_request_is_parsed_with_the_region_of_its_signature() -> None:
    request = _parse("CreateEndpoint", {"EndpointName": "my-endpoint", "EndpointConfigName": "my-config"})
    assert (request.operation, request.region) == ("CreateEndpoint", "eu-west-1")
    assert request.params["EndpointName"] == "my-endpoint"


@pytest.mark.parametrize(("operation", "params", "code", "words"), [
    ("CreateTrainingJob", {}, "UnknownOperationException", "CreateTrainingJob"),
    ("CreateEndpoint", {"EndpointName": "e"}, "ValidationException", "EndpointConfigName"),
    ("CreateEndpoint", {"EndpointName": "bad_name!", "EndpointConfigName": "c"}, "ValidationException", "pattern"),
    ("CreateEndpointConfig", {"EndpointConfigName": "c", "ProductionVariants": [
        {"VariantName": "AllTraffic", "ModelName": "m", "InstanceType": "ml.zz.huge"}]}, "ValidationException", "enum"),
    ("CreateEndpointConfig", {"EndpointConfigName": "c", "ProductionVariants": [
        {"VariantName": "AllTraffic", "ModelName": "m", "InstanceType": "ml.g5.xlarge", "InitialInstanceCount": "two"}]},
     "ValidationException", "InitialInstanceCount"),
])
def test_bad_requests_get_sagemakers_error(operation, params, code, words) -> None:
    with pytest.raises(api.ApiError) as caught:
        _parse(operation, params)
    assert caught.value.code == code and caught.value.status == 400
    assert words in caught.value.message


def test_a_body_that_is_not_json_is_a_serialization_error() -> None:
    with pytest.raises(api.ApiError, match="not JSON") as caught:
        api.parse("SageMaker.ListEndpoints", b"{nope", AUTH, OPERATIONS)
    assert caught.value.code == "SerializationException"


def test_replies_write_times_as_epoch_seconds_and_drop_missing_members() -> None:
    at = dt.datetime(2026, 12, 6, 12, 0, tzinfo=dt.timezone.utc)
    body = json.loads(api.reply_body({"CreationTime": at, "FailureReason": None, "Rows": [{"T": at}]}))
    assert body == {"CreationTime": at.timestamp(), "Rows": [{"T": at.timestamp()}]}
    error = json.loads(api.error_body(api.validation("Could not find endpoint")))
    assert error == {"__type": "ValidationException", "message": "Could not find endpoint"}


def test_list_pages_filter_sort_and_carry_a_token() -> None:
    base = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
    rows = [{"EndpointName": f"e{i}", "CreationTime": base + dt.timedelta(minutes=i)} for i in range(5)]
    first = _page(rows, {"MaxResults": 2}, "Endpoints", "EndpointName")
    assert [r["EndpointName"] for r in first["Endpoints"]] == ["e4", "e3"]  # newest first, SageMaker's default
    second = _page(rows, {"MaxResults": 2, "NextToken": first["NextToken"]}, "Endpoints", "EndpointName")
    assert [r["EndpointName"] for r in second["Endpoints"]] == ["e2", "e1"]
    by_name = _page(rows, {"SortBy": "Name", "SortOrder": "Ascending", "NameContains": "E3"}, "Endpoints", "EndpointName")
    assert by_name == {"Endpoints": [rows[3]]}


def test_one_interval_of_cloudwatch_data_counts_every_request() -> None:
    samples = [RequestSample(200, 1000.0, 50.0, 0.0, True), RequestSample(200, 3000.0, 2_000_050.0, 2_000_000.0, False),
               RequestSample(424, 0.0, 80.0, 0.0, None), RequestSample(503, 0.0, 0.0, 0.0, None)]
    dims = [{"Name": "EndpointName", "Value": "e"}, {"Name": "VariantName", "Value": "AllTraffic"}]
    data = metric_data(samples, 2, {"LoadedModelCount": [2, 1], "CPUUtilization": [40.0, 60.0]}, dims,
                       dt.datetime(2026, 12, 6))
    by_name = {d["MetricName"]: d["Values"] for d in data[SAGEMAKER_NS]}
    assert by_name["Invocations"] == [4.0] and by_name["InvocationsPerInstance"] == [2.0]
    assert by_name["Invocation4XXErrors"] == [1.0] and by_name["Invocation5XXErrors"] == [1.0]
    assert by_name["ModelLatency"] == [1000.0, 3000.0]
    assert by_name["ModelLoadingWaitTime"] == [2_000_000.0]
    assert by_name["ModelCacheHit"] == [1.0, 0.0]
    assert by_name["LoadedModelCount"] == [3.0]
    assert [(d["MetricName"], d["Values"]) for d in data[INSTANCE_NS]] == [("CPUUtilization", [50.0])]
    assert all(d["Dimensions"] == dims for d in data[SAGEMAKER_NS] + data[INSTANCE_NS])


def test_endpoint_metrics_keep_samples_only_when_asked() -> None:
    metrics = EndpointMetrics()
    metrics.request("a", 200, model_us=10.0, total_us=15.0, wait_us=0.0, hit=True)
    assert metrics.take_samples() == []
    metrics.keep_samples()
    before = time.time()
    metrics.request("a", 200, model_us=10.0, total_us=15.0, wait_us=0.0, hit=True)
    (sample,) = metrics.take_samples()
    assert sample[:5] == (200, 10.0, 5.0, 0.0, True) and before <= sample.at <= time.time()
    assert metrics.take_samples() == []


def test_moto_statistics_gain_percentiles_from_raw_values() -> None:
    from moto.cloudwatch import models

    enable_percentiles()
    stats = models.Statistics(["p90"], dt.datetime(2026, 12, 6))
    values = [float(v) for v in range(1, 101)]
    stats.metric_data = [models.MetricDatum("AWS/SageMaker", "ModelLatency", v, [], dt.datetime(2026, 12, 6))
                         for v in values]
    assert stats.get_statistics_for_type("p90") == pytest.approx(percentile(values, 90))
    assert stats.get_statistics_for_type("Sum") is None  # only the statistics asked for, as moto does


def test_images_of_known_releases_are_recognised() -> None:
    rel = release()
    assert release_of_image(triton_image_uri("eu-west-1", rel.name)).name == rel.name
    assert release_of_image("123456789012.dkr.ecr.us-east-1.amazonaws.com/my-triton:25.09") is None


def test_gpu_memory_comes_from_the_family_of_an_instance_type() -> None:
    a10g = load_instances()["ml.g5.2xlarge"]["gpu_memory_usable_mib"] * 2**20
    assert memory_of_gpu("ml.g5.12xlarge") == (a10g, "usable")
    assert memory_of_gpu("ml.c5.xlarge") is None
