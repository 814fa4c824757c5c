"""The model families are a table (packager/registry.py): each a row with a source object of one
protocol; --family, --list, name resolution and --with-tokenizer read the table, never a name."""

from __future__ import annotations

from pathlib import Path

import pytest

from mme.errors import UnknownModelError, UsageError
from packager import registry
from packager.registry import FAMILIES, ModelFamily, family_names, get_family, resolve
from packager.text_ensemble import check_text_family
from tests.packager.conftest import run_cli

PROTOCOL = ("supports_tokenizer", "open_names", "featured", "list_models", "owns", "owns_path", "load", "versions")


class ToySource:
    """A throwaway family: names toy-1 .. toy-3, image inputs, nothing loaded."""

    supports_tokenizer = False
    open_names = False
    featured: tuple[str, ...] = ()

    def list_models(self, pattern=None):
        return [n for n in ("toy-1", "toy-2", "toy-3") if pattern is None or n.startswith(pattern.rstrip("*"))]

    def owns(self, name):
        return name in self.list_models()

    def owns_path(self, path):
        return Path(path).suffix == ".toy"

    def load(self, request, reporter):
        raise NotImplementedError

    def versions(self):
        return {"toy": "1.0"}


TOY = ModelFamily("toy", "Toy", "toy models for the registry's tests", ToySource())


def test_each_family_is_a_row_with_a_source_of_the_protocol():
    assert family_names() == ["huggingface", "timm"]
    for family in FAMILIES:
        missing = [name for name in PROTOCOL if not hasattr(family.source, name)]
        assert not missing, (family.name, missing)
        assert get_family(family.name) is family
    assert [f.name for f in FAMILIES if f.source.supports_tokenizer] == ["huggingface"]
    with pytest.raises(UnknownModelError, match="unknown model family 'keras'; choose one of: huggingface, timm"):
        get_family("keras")


def test_a_new_family_is_one_row(monkeypatch, capsys):
    monkeypatch.setattr(registry, "FAMILIES", (*FAMILIES, TOY))
    assert resolve("toy-2") is TOY and resolve("toy-9.toy", weights_path=Path("w.toy")) is TOY
    assert resolve("resnet18").name == "timm" and resolve("bert-base-uncased").name == "huggingface"
    with pytest.raises(UnknownModelError, match="unknown model .toy-9.; did you mean toy-3, toy-2, toy-1"):
        resolve("toy-9", family="toy")  # a closed family knows its names
    assert resolve("org/anything", family="huggingface").name == "huggingface"  # an open one takes hub ids
    code, out, _ = run_cli(capsys, "package", "--list", "toy*")
    assert code == 0 and "toy: 3 models\n  toy-1\n  toy-2\n  toy-3\n" in out
    with pytest.raises(UsageError, match="--with-tokenizer applies to Hugging Face text models; toy-1 is a toy model"):
        check_text_family("toy-1", TOY)


def test_with_tokenizer_asks_the_family_what_it_supports():
    check_text_family("bert-base-uncased", get_family("huggingface"))
    with pytest.raises(UsageError, match="resnet18 is a timm model, whose inputs are not text"):
        check_text_family("resnet18", get_family("timm"))


def test_list_shows_a_featured_familys_count_and_another_familys_names(capsys):
    code, out, _ = run_cli(capsys, "package", "--list", "--family", "timm")
    assert code == 0 and out.startswith("timm: ") and "from the articles: resnet50, convnext_base" in out
    assert "huggingface" not in out
    code, out, _ = run_cli(capsys, "package", "--list", "--family", "huggingface")
    assert "  bert-base-uncased\n" in out and "timm" not in out
