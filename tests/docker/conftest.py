"""Helpers for the Docker and version-matrix tests: a small Dockerfile parser, the
Makefile's dry runs, and parsing an image's command with the real `mme` parser."""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCKER_DIR = REPO / "docker"
IMAGES = ("builder", "serving", "bench")
NVIDIA_ENTRYPOINT = "/opt/nvidia/nvidia_entrypoint.sh"


@dataclass
class Instruction:
    keyword: str  # upper case: FROM, ARG, RUN, ...
    args: str  # the rest of the logical line, continuations joined
    line: int  # where it starts (1-based)

    def json_args(self) -> list[str] | None:
        """The exec (JSON array) form's argv, or None for the shell form."""
        text = self.args.strip()
        if not text.startswith("["):
            return None
        return json.loads(text)


@dataclass
class Stage:
    base: str  # FROM's image reference, unexpanded
    name: str | None
    instructions: list[Instruction] = field(default_factory=list)

    def all(self, keyword: str) -> list[Instruction]:
        return [i for i in self.instructions if i.keyword == keyword]

    def last(self, keyword: str) -> Instruction | None:
        found = self.all(keyword)
        return found[-1] if found else None


@dataclass
class Dockerfile:
    path: Path
    global_args: dict[str, str | None]
    stages: list[Stage]

    @property
    def final(self) -> Stage:
        return self.stages[-1]

    def declared_args(self) -> dict[str, str | None]:
        """Every ARG (global and per stage) with its default; a later default must agree."""
        args = dict(self.global_args)
        for stage in self.stages:
            for ins in stage.all("ARG"):
                name, _, default = ins.args.strip().partition("=")
                value = default if _ else None
                if name in args and args[name] is not None and value is not None and args[name] != value:
                    raise AssertionError(f"{self.path}: ARG {name} has two defaults ({args[name]}, {value})")
                if value is not None or name not in args:
                    args[name] = value
        return args

    def resolve(self, text: str) -> str:
        """``text`` with ${ARG} / $ARG replaced by the global ARG defaults."""
        for name, value in self.global_args.items():
            if value is not None:
                text = text.replace("${" + name + "}", value).replace("$" + name, value)
        return text


def logical_lines(text: str) -> list[tuple[int, str]]:
    """Dockerfile logical lines: continuations (trailing backslash) joined, comment lines
    and blank lines dropped (also inside a continuation, as Docker does)."""
    lines: list[tuple[int, str]] = []
    current, start = "", 0
    for number, raw in enumerate(text.splitlines(), 1):
        stripped = raw.strip()
        if not current and (not stripped or stripped.startswith("#")):
            continue
        if current and stripped.startswith("#"):
            continue
        if not current:
            start = number
        if raw.rstrip().endswith("\\"):
            current += raw.rstrip()[:-1] + " "
            continue
        current += raw
        lines.append((start, current.strip()))
        current = ""
    if current:
        lines.append((start, current.strip()))
    return lines


def parse_dockerfile(path: Path) -> Dockerfile:
    global_args: dict[str, str | None] = {}
    stages: list[Stage] = []
    for number, line in logical_lines(path.read_text()):
        keyword, _, args = line.partition(" ")
        keyword = keyword.upper()
        ins = Instruction(keyword, args.strip(), number)
        if keyword == "FROM":
            parts = ins.args.split()
            parts = [p for p in parts if not p.startswith("--platform")]
            name = parts[2] if len(parts) >= 3 and parts[1].upper() == "AS" else None
            stages.append(Stage(parts[0], name))
        elif not stages:
            assert keyword == "ARG", f"{path}:{number}: only ARG may come before the first FROM"
            name, eq, default = ins.args.partition("=")
            global_args[name.strip()] = default.strip() if eq else None
        else:
            stages[-1].instructions.append(ins)
    return Dockerfile(path, global_args, stages)


def dockerfile(image: str) -> Dockerfile:
    return parse_dockerfile(DOCKER_DIR / image / "Dockerfile")


def image_command(df: Dockerfile) -> list[str]:
    """ENTRYPOINT + CMD of the final stage (exec form), as the container runs them."""
    entry = df.final.last("ENTRYPOINT")
    cmd = df.final.last("CMD")
    assert entry is not None and entry.json_args() is not None, f"{df.path}: ENTRYPOINT must use the exec (JSON) form"
    assert cmd is not None and cmd.json_args() is not None, f"{df.path}: CMD must use the exec (JSON) form"
    return entry.json_args() + cmd.json_args()


def mme_argv(argv: list[str]) -> list[str]:
    """The arguments given to `mme` in a container command line (after the NVIDIA
    entrypoint wrapper, if any)."""
    if argv and argv[0] == NVIDIA_ENTRYPOINT:
        argv = argv[1:]
    assert argv and Path(argv[0]).name == "mme", f"the command does not run mme: {argv}"
    return argv[1:]


def subcommands() -> set[str]:
    from mme.cli import build_parser

    parser = build_parser()
    action = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    return set(action.choices)


def parse_mme(args: list[str]):
    """Parse ``mme ARGS`` with the real parser: the Namespace, or None when ARGS asked for
    --help (argparse exits 0). A subcommand mme does not have fails the test."""
    from mme.cli import build_parser

    if args and not args[0].startswith("-"):
        assert args[0] in subcommands(), f"`mme {args[0]}` is not a subcommand of mme/cli.py"
    try:
        return build_parser().parse_args(args)
    except SystemExit as exc:
        assert exc.code == 0, f"mme {' '.join(args)} exited {exc.code}"
        return None


def option_value(argv: list[str], option: str) -> str | None:
    for i, arg in enumerate(argv[:-1]):
        if arg == option:
            return argv[i + 1]
    return None


def hadolint() -> str | None:
    local = Path(sys.prefix) / "bin" / "hadolint"
    if local.exists():
        return str(local)
    return shutil.which("hadolint")


def make_dry_run(*args: str) -> list[list[str]]:
    """`make -n ARGS` in the repository: each printed command as argv (shell-split)."""
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    done = subprocess.run(["make", "--no-print-directory", "-n", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    return [shlex.split(line) for line in done.stdout.splitlines() if line.strip()]


def docker_commands(lines: list[list[str]], verb: str) -> list[list[str]]:
    return [argv for argv in lines if len(argv) > 1 and Path(argv[0]).name == "docker" and argv[1] == verb]
