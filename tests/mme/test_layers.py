"""The layer order `make lint` checks with import-linter ([tool.importlinter] in pyproject.toml):
its kernel layer names every module of the shared kernel, so a new kernel module cannot slip
out of the contract; the command line is mme.cli; and the contract is kept."""

from __future__ import annotations

import pkgutil
import subprocess
import sys
import tomllib

import mme
from tests.docker.conftest import REPO

CONTRACT = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"][0]


def _layer(text: str) -> set[str]:
    return {part.strip() for part in text.replace("|", ":").split(":")}


def test_the_kernel_layer_lists_every_module_of_the_kernel():
    kernel = _layer(CONTRACT["layers"][-1])
    top = _layer(CONTRACT["layers"][0])
    modules = {f"mme.{m.name}" for m in pkgutil.iter_modules(mme.__path__)} - {"mme.__main__"}
    assert "mme.cli" in top
    assert modules - top == kernel, f"add {sorted(modules - top - kernel)} to the kernel layer of [tool.importlinter]"


def test_the_layers_run_from_the_command_line_down_to_the_kernel():
    assert [_layer(text) for text in CONTRACT["layers"][1:5]] == [{"bench"}, {"sizing"}, {"serving"}, {"packager"}]


def test_the_layer_contract_is_kept():
    lint = REPO / ".venv" / "bin" / "lint-imports"
    command = [str(lint)] if lint.exists() else [sys.executable, "-m", "importlinter.cli"]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
