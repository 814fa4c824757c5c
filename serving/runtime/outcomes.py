"""What one invocation came to, in the endpoint's terms: the typed outcomes that
:meth:`serving.runtime.endpoint.MultiModelEndpoint.invoke` returns. They say nothing of HTTP;
serving/runtime/front.py is the one place that turns each into SageMaker Runtime's reply (through
serving/runtime/errors_sagemaker.py).

Every outcome carries the timings the metrics need: ``model_s`` (the container's time; 0
when it was not called), ``wait_s`` (time waited for a model load) and ``hit`` (whether the
model was loaded when asked; None when the request never needed a model).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class Outcome:
    model_s: float = 0.0
    wait_s: float = 0.0
    hit: bool | None = None


@dataclass(frozen=True)
class Invoked(Outcome):
    """The container answered 200: its body and content type go back to the client."""

    body: bytes
    content_type: str


@dataclass(frozen=True)
class MissingTarget(Outcome):
    """No target model named: this is a multi-model endpoint."""


@dataclass(frozen=True)
class TargetOnRealTime(Outcome):
    """A target model named on a real-time (single-model) endpoint, which takes none."""


@dataclass(frozen=True)
class InvalidTarget(Outcome):
    """The target's name is not one SageMaker accepts (the error says why)."""

    error: Exception


@dataclass(frozen=True)
class PayloadTooLarge(Outcome):
    limit: int


@dataclass(frozen=True)
class ModelStillLoading(Outcome):
    """Not loaded within the model wait timeout; its load goes on."""

    target: str
    wait_timeout_s: float


@dataclass(frozen=True)
class ModelEvicted(Outcome):
    """Unloaded to make room each time, before it could serve this request."""

    target: str


@dataclass(frozen=True)
class ShuttingDown(Outcome):
    """The endpoint is shutting down while the target was still loading."""

    target: str


@dataclass(frozen=True)
class ContainerUnavailable(Outcome):
    """The container gave no answer to the invocation (and was not found dead, or was restarted once already)."""

    detail: str


@dataclass(frozen=True)
class InsufficientMemory(Outcome):
    """The container answered a load with 507 and every loaded model was serving: nothing to evict."""

    body: str  # the container's raw answer
    status: int = 507


@dataclass(frozen=True)
class LoadRefused(Outcome):
    """The container refused to load the model (its answer, status and raw body)."""

    status: int
    body: str


@dataclass(frozen=True)
class InvokeFailed(Outcome):
    """The container answered the invocation with an error status (its raw body)."""

    status: int
    body: str


@dataclass(frozen=True)
class ModelTimedOut(Outcome):
    """The container did not answer the invocation within the invocation timeout."""


@dataclass(frozen=True)
class LoadError(Outcome):
    """Getting the model failed before or around the container's load (store, extraction, load
    timeout); the error carries its SageMaker code (``sagemaker_error``) and ``retryable``."""

    error: Exception
