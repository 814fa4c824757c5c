"""User-facing errors of the cloud commands (one line that says how to fix it)."""

from __future__ import annotations

from mme.errors import MmeError


class AwsError(MmeError):
    """A cloud command cannot go on; the message says what to change."""


class CredentialsError(AwsError):
    """No region or no credentials in botocore's usual chain."""


class S3Error(AwsError):
    """A bucket or object cannot be read or written."""


class RandomWeightsRefused(AwsError):
    """The artifact was packaged with random weights and the user did not allow that."""


class VerificationError(AwsError):
    """What S3 holds after a write is not what was written."""

    exit_code = 3


class DeployError(AwsError):
    """A deployment request is invalid or conflicts with what already exists."""


class EndpointFailed(DeployError):
    """SageMaker reported the endpoint as Failed (the message carries its FailureReason)."""

    exit_code = 3


class WaitTimeout(AwsError):
    """A resource did not reach its final state within the wait timeout."""

    exit_code = 3


class CompileFailed(AwsError):
    """The SageMaker training job that builds the TensorRT plan failed or was stopped."""

    exit_code = 3


class Interrupted(AwsError):
    """Ctrl-C during a cloud command; the message says what was left and how to clean up."""

    exit_code = 130
