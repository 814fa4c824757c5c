"""User-facing errors.

Every error a user can cause is an :class:`MmeError`: its message is one line that says
what was wrong and how to fix it. ``mme.cli.main`` prints it without a traceback and
exits with the error's ``exit_code``.
"""

from __future__ import annotations


class MmeError(Exception):
    """A problem the user can fix; the message says how."""

    exit_code = 2


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
