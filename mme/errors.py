"""User-facing errors.

Every error a user can cause is an :class:`MmeError`: its message is one line that says
what was wrong and how to fix it. ``mme.cli.main`` prints it without a traceback and
exits with the error's ``exit_code``.
"""

from __future__ import annotations


class MmeError(Exception):
    """A problem the user can fix; the message says how.

    ``retryable`` says whether sending the same request again can succeed without anyone fixing
    anything (True: a transient state such as a file still being written or a network blip;
    False: something must be fixed first; None: not known). A class sets its default; one
    instance can say otherwise (``SomeError(message, retryable=True)``).
    """

    exit_code = 2
    retryable: bool | None = None

    def __init__(self, *args: object, retryable: bool | None = None) -> None:
        super().__init__(*args)
        if retryable is not None:
            self.retryable = retryable


def retry_advice(exc: BaseException) -> str:
    """One sentence saying whether retrying ``exc``'s request can help ('' when not known)."""
    retryable = getattr(exc, "retryable", None)
    if retryable is True:
        return "Retrying can help."
    if retryable is False:
        return "Retrying will not help until this is fixed."
    return ""


LOCAL_HINT = " (local: "  # how a message worded as AWS words it adds what only holds here


def with_retry_advice(exc: BaseException) -> str:
    """``exc``'s message followed by :func:`retry_advice`; inside a closing ``(local: ...)`` hint
    when there is one, so a message worded as AWS words it keeps that wording up to the hint."""
    message, advice = str(exc).rstrip(), retry_advice(exc)
    if not advice:
        return message
    if LOCAL_HINT in message and message.endswith(")"):
        return f"{message[:-1]}; {advice[0].lower()}{advice[1:].rstrip('.')})"
    return f"{message}{'' if message.endswith('.') else '.'} {advice}"


class UsageError(MmeError):
    """Bad command-line arguments or option values."""


class UnknownModelError(MmeError):
    """A model name that no registered family knows."""


class WeightsUnavailableError(MmeError):
    """Requested weights could not be loaded (hub unreachable, bad checkpoint)."""


class GpuRequiredError(MmeError):
    """The requested format needs an NVIDIA GPU and GPU-only packages."""


class OutputDirError(MmeError):
    """The output location cannot be written."""


class ExportError(MmeError):
    """An exporter failed on this model (unsupported operator, tracing failure...)."""

    exit_code = 3


class ValidationError(MmeError):
    """An exported model does not compute what the PyTorch model computes."""

    exit_code = 3


class OutputNamesMismatchError(ValidationError):
    pass


class OutputShapeMismatchError(ValidationError):
    pass


class OutputValuesMismatchError(ValidationError):
    pass
