"""The README stays a ten-minute read that names where everything lives: its layout section
names every package of the product, and every page it links to exists."""

from __future__ import annotations

import re

from tests.docker.conftest import REPO

README = (REPO / "README.md").read_text()
LAYOUT = README.split("## Layout of this repository", 1)[1].split("```", 2)[1]
PRODUCT = ("mme", "packager", "serving", "sizing", "bench")


def test_the_layout_names_every_package_of_the_product():
    packages = sorted({p.parent.relative_to(REPO).as_posix() for top in PRODUCT
                       for p in (REPO / top).rglob("__init__.py")})
    missing = [p for p in packages if f"{p.rsplit('/', 1)[-1]}/" not in LAYOUT]
    assert not missing, f"README's layout section does not name {missing}"


def test_the_readme_is_short_and_its_pages_exist():
    assert len(README.splitlines()) <= 250
    for link in re.findall(r"\]\((docs/[^)]+)\)", README):
        assert (REPO / link).is_file(), link
    assert "make demo" in README and "make test" in README
