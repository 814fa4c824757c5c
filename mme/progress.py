"""Progress lines on stderr: what is running and how long each step took."""

from __future__ import annotations

import io
import sys
import time
import warnings
from contextlib import contextmanager, redirect_stdout
from dataclasses import dataclass, field
from typing import Iterator, TextIO


@dataclass
class Reporter:
    """Prints one line per event; collects stage timings for manifests."""

    stream: TextIO = field(default_factory=lambda: sys.stderr)
    quiet: bool = False

    def info(self, message: str) -> None:
        if not self.quiet:
            print(message, file=self.stream, flush=True)

    def warn(self, message: str) -> None:
        # Warnings are printed even in quiet mode: they change what the artifact is.
        print(f"WARNING: {message}", file=self.stream, flush=True)

    @contextmanager
    def stage(self, label: str, timings: dict[str, float] | None = None, key: str | None = None) -> Iterator[None]:
        self.info(f"  {label} ...")
        start = time.perf_counter()
        yield
        elapsed = time.perf_counter() - start
        if timings is not None and key is not None:
            timings[key] = round(timings.get(key, 0.0) + elapsed, 3)
        self.info(f"  {label} done in {elapsed:.1f} s")


@contextmanager
def library_output_captured() -> Iterator[io.StringIO]:
    """Hold back what exporters print and warn (torch.onnx progress lines, tracer warnings)
    so progress stays readable; callers include it in errors when the step fails."""
    buffer = io.StringIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with redirect_stdout(buffer):
            yield buffer
