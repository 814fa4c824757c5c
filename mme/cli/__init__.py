"""The ``mme`` command line: one subcommand per pipeline step, the top layer of the house.

``main(argv)`` is what tests call in-process; ``entry_point`` is the console script.
Each module of this package registers its subcommand(s) and imports the stage it drives
only when that subcommand runs, so ``mme --help`` stays fast: the one place where the
project's own imports sit inside functions (ruff's PLC0415 is off here, pyproject.toml).
"""

from __future__ import annotations

import argparse
import importlib
import sys
import warnings
from typing import Sequence

from mme import __version__
from mme.errors import MmeError, UsageError

# Modules that define ``register(subparsers)``; order is the order shown in --help.
COMMAND_MODULES = (
    "mme.cli.package",
    "mme.cli.serve",
    "mme.cli.capacity",
    "mme.cli.bench",
    "mme.cli.report",
    "mme.cli.demo",
    "mme.cli.demo_realtime",
    "mme.cli.demo_fleet",
    "mme.cli.demo_cloud",
    "mme.cli.aws",
    "mme.cli.cloud",
    "mme.cli.gpu_check",
)


class _Parser(argparse.ArgumentParser):
    """argparse that raises instead of printing usage and exiting."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(f"{self.prog}: {message} (see '{self.prog} --help')")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="mme",
        description="Package, serve locally, size and load-test models for GPU multi-model endpoints.",
    )
    parser.add_argument("--version", action="version", version=f"mme {__version__}")
    parser.add_argument("-q", "--quiet", action="store_true", help="print only warnings, errors and results")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for module_name in COMMAND_MODULES:
        importlib.import_module(module_name).register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    # Triton's libtorch backend still loads TorchScript: its deprecation notice is noise here.
    warnings.filterwarnings("ignore", message=r"`torch\.jit\.\w+` is deprecated", category=FutureWarning)
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        if args.command is None:
            parser.print_help()
            return 2
        return int(args.func(args) or 0)
    except MmeError as exc:
        print(f"mme: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("mme: interrupted; nothing half-written was left behind", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # `mme ... | head`: the reader left; exit quietly like other command-line tools.
        sys.stderr.close()
        return 141


def entry_point() -> None:
    sys.exit(main())
