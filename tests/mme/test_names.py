"""One home per name: no public top-level name is defined by two modules of the product, so an
import says which idea it takes. The exceptions are conventions, not ideas: each model family's
source module implements the same protocol (packager.registry.FamilySource), each command module
has register/run, each script main, each file format its SCHEMA_VERSION, units, TypeVars, and the
code that runs outside this package (inside Triton's python stub or a SageMaker job's image)."""

from __future__ import annotations

import ast
import collections

from tests.docker.conftest import REPO

PRODUCT = ("mme", "packager", "serving", "sizing", "bench")
CONVENTIONS = {"register", "run", "main", "SCHEMA_VERSION", "KIB", "MIB", "GIB", "T",
               "FAMILY", "load", "owns", "list_models", "versions"}
STANDALONE = {"packager/backends", "serving/metrics_model", "bench/gpu_check/torchscript_cuda_model.py",
              "packager/remote/trt_build_entry.py"}


def public_names() -> dict[str, list[str]]:
    found = collections.defaultdict(list)
    for top in PRODUCT:
        for path in sorted((REPO / top).rglob("*.py")):
            where = path.relative_to(REPO).as_posix()
            if any(where.startswith(s) for s in STANDALONE):
                continue
            for node in ast.parse(path.read_text()).body:
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    names = [node.name]
                elif isinstance(node, ast.Assign):
                    names = [t.id for t in node.targets if isinstance(t, ast.Name)]
                elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                    names = [node.target.id]
                else:
                    names = []
                for name in names:
                    if not name.startswith("_"):
                        found[name].append(where)
    return found


def test_no_public_name_has_two_homes():
    twice = {name: homes for name, homes in public_names().items() if len(homes) > 1 and name not in CONVENTIONS}
    assert not twice, f"one home per name: {twice}"
