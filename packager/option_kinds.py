"""How the options of :mod:`packager.options` read their values: from the command line
(argparse: ``add``) and from a catalogue's TOML (``from_toml``, checked as the command line checks
the option), and how a value is written back as ``mme package`` arguments (``argv``)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from mme.argtypes import int_list

if TYPE_CHECKING:
    from packager.options import PackageOption


class Kind:
    """How an option's values are read from the command line and from TOML, and written back."""

    expected = "a non-empty string"  # what a TOML value must be, in the error
    parse: Callable[[str], Any] = str  # argparse's type

    def add(self, parser: Any, option: PackageOption) -> None:
        parser.add_argument(option.flag, dest=option.name, type=self.parse, default=self.cli_default(option.default),
                            choices=option.choices, metavar=option.metavar, help=option.help_text())

    def cli_default(self, default: Any) -> Any:
        return default

    def from_toml(self, option: PackageOption, value: Any) -> Any:
        """The option's value of a TOML value: TypeError(what it must be) or ValueError(why)."""
        if not isinstance(value, str) or not value:
            raise TypeError(self.expected)
        return value

    def argv(self, option: PackageOption, value: Any) -> list[str]:
        return [str(option.flag), str(value)]


class Choice(Kind):
    def from_toml(self, option: PackageOption, value: Any) -> Any:
        if value not in (option.choices or ()):
            raise TypeError("one of " + ", ".join(f'"{c}"' for c in option.choices or ()))
        return value


class Number(Kind):
    def __init__(self, parse: Callable[[str], Any], integer: bool) -> None:
        self.parse, self.integer = parse, integer
        self.expected = "an integer" if integer else "a number"

    def from_toml(self, option: PackageOption, value: Any) -> Any:
        if isinstance(value, bool) or not isinstance(value, int if self.integer else (int, float)):
            raise TypeError(self.expected)
        try:  # the command line's own check of the value (mme.argtypes)
            return self.parse(self.text(value))
        except argparse.ArgumentTypeError as exc:
            raise ValueError(str(exc)) from None

    def text(self, value: Any) -> str:
        return str(value) if self.integer else repr(float(value))

    def argv(self, option: PackageOption, value: Any) -> list[str]:
        return [str(option.flag), self.text(value)]


class Flag(Kind):
    """``--flag`` sets it (TOML: true or false)."""

    expected = "true or false"

    def add(self, parser: Any, option: PackageOption) -> None:
        parser.add_argument(option.flag, dest=option.name, action="store_true", help=option.help_text())

    def from_toml(self, option: PackageOption, value: Any) -> Any:
        if not isinstance(value, bool):
            raise TypeError(self.expected)
        return value

    def argv(self, option: PackageOption, value: Any) -> list[str]:
        return [str(option.flag)] if value else []


class Switch(Flag):
    """``--flag`` / ``--no-flag``."""

    def add(self, parser: Any, option: PackageOption) -> None:
        parser.add_argument(option.flag, dest=option.name, action=argparse.BooleanOptionalAction,
                            default=option.default, help=option.help_text())

    def argv(self, option: PackageOption, value: Any) -> list[str]:
        return [str(option.flag) if value else str(option.flag).replace("--", "--no-", 1)]


class Names(Kind):
    """Comma-separated names (TOML: a list of names, or the same comma-separated string)."""

    expected = 'a list of names, e.g. ["onnx", "cpu-local"]'

    def from_toml(self, option: PackageOption, value: Any) -> Any:
        if isinstance(value, str):
            value = [v.strip() for v in value.split(",")]
        if not isinstance(value, list) or not value or not all(isinstance(v, str) and v for v in value):
            raise TypeError(self.expected)
        return ",".join(value)


class Numbers(Kind):
    expected = "a list of integers, e.g. [4, 8]"
    parse = staticmethod(int_list)

    def from_toml(self, option: PackageOption, value: Any) -> Any:
        if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            raise TypeError(self.expected)
        try:
            return int_list(",".join(map(str, value)))
        except argparse.ArgumentTypeError as exc:
            raise ValueError(str(exc)) from None

    def argv(self, option: PackageOption, value: Any) -> list[str]:
        return [str(option.flag), ",".join(map(str, value))] if value else []


class LocalPath(Kind):
    parse = Path

    def from_toml(self, option: PackageOption, value: Any) -> Any:
        return Path(super().from_toml(option, value))


class Consts(Kind):
    """Named values, each set by a flag of its own (``--pretrained``); TOML: the value's name."""

    def add(self, parser: Any, option: PackageOption) -> None:
        for value, flag, text in option.consts:
            parser.add_argument(flag, dest=option.name, action="store_const", const=value, default=option.default,
                                help=text)

    def from_toml(self, option: PackageOption, value: Any) -> Any:
        names = [option.default, *(v for v, _, _ in option.consts)]
        if value not in names:
            raise TypeError(", ".join(f'"{n}"' for n in names[:-1]) + f' or "{names[-1]}"' + option.toml_note)
        return value

    def argv(self, option: PackageOption, value: Any) -> list[str]:
        return [flag for const, flag, _ in option.consts if const == value]
