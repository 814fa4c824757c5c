"""The Triton settings users tune (:class:`TritonOptions`), apart from config.pbtxt's schema
(:mod:`packager.triton_config`) so that the option table, and with it ``mme --help`` and the
slim bench image's command line, need no protobuf."""

from __future__ import annotations

from dataclasses import dataclass

from mme.errors import UsageError


@dataclass(frozen=True)
class TritonOptions:
    """The config values users tune."""

    max_batch_size: int = 16
    dynamic_batching: bool = True
    preferred_batch_sizes: tuple[int, ...] = ()
    max_queue_delay_us: int = 100
    instance_count: int = 1
    instance_kind: str | None = None  # None: the format's default (KIND_GPU, KIND_CPU for cpu-local)
    warmup: bool = False

    def check(self) -> None:
        if self.max_batch_size < 1:
            raise UsageError(f"--max-batch-size must be 1 or more (got {self.max_batch_size})")
        if self.instance_count < 1:
            raise UsageError(f"--instance-count must be 1 or more (got {self.instance_count})")
        if self.max_queue_delay_us < 0:
            raise UsageError(f"--max-queue-delay-us must be 0 or more (got {self.max_queue_delay_us})")
        bad = [b for b in self.preferred_batch_sizes if not 1 <= b <= self.max_batch_size]
        if bad:
            raise UsageError(
                f"--preferred-batch-sizes {bad} must lie between 1 and --max-batch-size {self.max_batch_size}"
            )
