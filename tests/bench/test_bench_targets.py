"""Target models: names as ``mme serve --copies N`` answers for them, uniform or Zipf-skewed."""

from __future__ import annotations

from collections import Counter

import pytest

from bench.targets import DEFAULT_TEMPLATE, TargetPicker, parse_distribution, served_renumbering, target_names
from mme.errors import UsageError
from serving.models.copies import copy_name


def test_default_names_match_the_local_endpoints_copies_and_the_articles_numbering():
    """The first article's notebook makes <model>-v0 ... -v{N-1} and its Locust file asks for
    -v{randint(0, N-1)}: mme's copies are numbered the same way."""
    names = target_names("resnet50", 4)
    assert names == tuple(copy_name("resnet50.tar.gz", i) for i in range(4))
    assert names == tuple(f"resnet50-v{i}.tar.gz" for i in range(4))  # the article's -v0 ... -v{N-1}
    assert target_names("bert", 2, "{model}/copy-{i}.tar.gz") == ("bert/copy-0.tar.gz", "bert/copy-1.tar.gz")


def test_copies_numbered_from_one_get_a_one_line_warning_naming_the_change():
    old = ("resnet50-v1.tar.gz", "resnet50-v2.tar.gz", "resnet50-v3.tar.gz", "other.tar.gz")
    note = served_renumbering("resnet50", old, "the endpoint at http://x")
    assert note is not None and "\n" not in note
    assert "resnet50-v1 ... resnet50-v3" in note and "resnet50-v0" in note and "-v0 ... -v{N-1}" in note
    assert served_renumbering("resnet50", ("resnet50-v0.tar.gz", "resnet50-v1.tar.gz"), "e") is None
    assert served_renumbering("resnet50", ("resnet50.tar.gz",), "e") is None
    assert served_renumbering("resnet50", None, "e") is None


def test_bad_templates_and_distributions():
    with pytest.raises(UsageError, match="has no"):
        target_names("m", 3, "{model}.tar.gz")
    with pytest.raises(UsageError, match="only {model} and {i}"):
        target_names("m", 2, "{model}-{n}-{i}")
    with pytest.raises(UsageError, match="uniform or zipf"):
        parse_distribution("pareto")
    with pytest.raises(UsageError, match="positive exponent"):
        parse_distribution("zipf:-1")
    assert str(parse_distribution("zipf:1.1")) == "zipf:1.1"
    assert DEFAULT_TEMPLATE == "{model}-v{i}.tar.gz"


def test_zipf_skews_toward_low_indices():
    names = target_names("m", 20)
    picker = TargetPicker(names, parse_distribution("zipf:1.1"), seed=7)
    counts = Counter(picker.pick() for _ in range(20_000))
    shares = [counts[n] / 20_000 for n in names]
    expected = picker.probabilities()
    assert expected[0] == pytest.approx(1 / sum(1 / i ** 1.1 for i in range(1, 21)))
    for got, want in zip(shares, expected):
        assert got == pytest.approx(want, abs=0.012)
    assert shares[0] > 2 * shares[1] > shares[4]  # v0 is hot
    assert sum(shares[:5]) > 0.55 > sum(shares[10:])  # a short head, a long cold tail


def test_uniform_spreads_evenly():
    names = target_names("m", 5)
    picker = TargetPicker(names, parse_distribution("uniform"), seed=3)
    counts = Counter(picker.pick() for _ in range(10_000))
    assert set(counts) == set(names)
    assert max(counts.values()) / min(counts.values()) < 1.15
