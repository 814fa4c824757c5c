"""Choosing weights: pretrained from the hub, random, or a local checkpoint.

The default (``auto``) takes pretrained weights when they can be had and otherwise falls
back to random weights of the same architecture with a loud warning; the manifest then
says ``weights: random`` so that a later ``mme push`` can refuse it. A benchmark needs
no trained weights; a production artifact does.
"""

from __future__ import annotations

from typing import Any, Callable

from mme.errors import WeightsUnavailableError
from mme.progress import Reporter
from packager.model import ModelRequest


def load_with_weights(
    request: ModelRequest,
    reporter: Reporter,
    *,
    pretrained: Callable[[], Any],
    random: Callable[[], Any],
    local: Callable[[], Any],
) -> tuple[Any, str]:
    """Return ``(result, weights)`` where weights is "pretrained", "random" or "local"."""
    if request.weights == "random":
        return random(), "random"
    if request.weights == "local":
        if request.weights_path is None or not request.weights_path.exists():
            raise WeightsUnavailableError(
                f"--weights {request.weights_path}: no such file or directory; pass a local checkpoint file or a Hugging Face model directory"
            )
        try:
            return local(), "local"
        except WeightsUnavailableError:
            raise
        except Exception as exc:  # the libraries raise many types for a bad checkpoint
            raise WeightsUnavailableError(
                f"could not load --weights {request.weights_path} into {request.name}: {_first_line(exc)}; "
                "check that the checkpoint was saved from this architecture"
            ) from None
    try:
        return pretrained(), "pretrained"
    except Exception as exc:
        reason = _first_line(exc)
        if request.weights == "pretrained":
            raise WeightsUnavailableError(
                f"pretrained weights for {request.name} could not be loaded ({reason}); "
                "pass --weights PATH for a local copy, or --no-pretrained for random weights"
            ) from None
    reporter.warn("=" * 78)
    reporter.warn(f"pretrained weights for {request.name} are not reachable ({reason}).")
    reporter.warn("Packaging RANDOM weights of the same architecture and size: fine for benchmarks,")
    reporter.warn("useless in production. The manifest records `weights: random`.")
    reporter.warn("Use --weights PATH for a local checkpoint, or --no-pretrained to ask for this.")
    reporter.warn("=" * 78)
    return random(), "random"


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    first = text[0] if text else type(exc).__name__
    return first.split(". ")[0][:160]
