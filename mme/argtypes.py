"""argparse value types shared by the subcommands: each rejects bad input with a message
that says what was expected (argparse turns it into the one-line usage error)."""

from __future__ import annotations

import argparse
import math
from typing import Callable


def int_at_least(minimum: int) -> Callable[[str], int]:
    expected = "a positive integer" if minimum == 1 else f"an integer of at least {minimum}"

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = minimum - 1
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be {expected}, got {text!r}")
        return value

    return parse


positive_int = int_at_least(1)
non_negative_int = int_at_least(0)


def float_where(accept: Callable[[float], bool], expected: str) -> Callable[[str], float]:
    """An argparse type: a finite number that ``accept`` takes, else "must be <expected>"."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not (math.isfinite(value) and accept(value)):
            raise argparse.ArgumentTypeError(f"must be {expected}, got {text!r}")
        return value

    return parse


positive_float = float_where(lambda v: v > 0, "a positive number")
non_negative_float = float_where(lambda v: v >= 0, "a number of 0 or more")
share = float_where(lambda v: 0 <= v <= 1, "a share between 0 and 1")  # 0 allowed, unlike fraction
fraction = float_where(lambda v: 0 < v <= 1, "a fraction in (0, 1]")


def byte_size(text: str) -> int:
    """``4G``, ``512M``, ``1.5GiB`` or a plain number of bytes."""
    units = {"k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}
    cleaned = text.strip().lower().removesuffix("ib").removesuffix("b")
    scale = units.get(cleaned[-1:], 1)
    number = cleaned[:-1] if scale != 1 else cleaned
    try:
        value = int(float(number) * scale)
    except ValueError:
        value = 0
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a number of bytes like 4G or 512M, got {text!r}")
    return value


def int_list(text: str) -> tuple[int, ...]:
    return tuple(positive_int(part) for part in text.split(",") if part.strip())
