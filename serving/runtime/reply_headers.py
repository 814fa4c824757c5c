"""The local endpoint's own reply headers on invocations: not SageMaker's (its clients, boto3
included, ignore them), added so a load test can tell a request that waited for its model to
be fetched and loaded (cold) from one served by a loaded model (warm), per request, without
guessing from latency. Written by serving/runtime/front.py, read by bench/client.py; no dependencies,
so the bench image imports it without the serving stack."""

# SageMaker's own request header naming the target model of a multi-model endpoint (botocore's
# sagemaker-runtime TargetModel), which Triton's SageMaker mode also reads: here too, beside the
# headers the bench reads, so that the load generator takes it without the serving stack.
TARGET_HEADER = "X-Amzn-SageMaker-Target-Model"
COLD_HEADER = "X-Mme-Cold"  # "1": the target was not loaded when the request came; "0": it was
LOAD_WAIT_HEADER = "X-Mme-Load-Wait-Ms"  # how long the request waited for the load (download included)


def cold_headers(hit: bool | None, wait_s: float) -> dict[str, str]:
    """The headers for an invocation whose model was (``hit``) or was not loaded; none when
    the request never needed a model (``hit`` None)."""
    if hit is None:
        return {}
    return {COLD_HEADER: "0" if hit else "1", LOAD_WAIT_HEADER: f"{wait_s * 1000:.1f}"}


def read_cold(value: str | list[str] | None) -> int | None:
    """1 cold, 0 warm, None when the endpoint did not say (SageMaker's own endpoints). A
    header read as a list (repeated) counts by its first value."""
    if isinstance(value, list):
        value = value[0] if value else None
    return {"1": 1, "0": 0}.get((value or "").strip())
