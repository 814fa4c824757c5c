"""bench.per_model: the per-target table of a fleet run, read through the one requests.csv
reader (bench.results) with the one percentile (mme.stats)."""

from __future__ import annotations

from pathlib import Path

from bench.per_model import per_model
from bench.results import REQUESTS_FILE, RequestRecord, RequestWriter
from mme.stats import percentile


def _write(run_dir: Path, records: list[RequestRecord]) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    writer = RequestWriter(run_dir)
    writer.write(records)
    writer.close()


def _request(target: str, latency: float, ok: int = 1, cold: int | None = 0, cut_off: int = 0) -> RequestRecord:
    return RequestRecord(0.0, 0, 1, target, latency, ok, 200 if ok else 424, "" if ok else "ModelError", "h:1",
                         cut_off=cut_off, cold=cold)


def test_each_target_gets_its_counts_percentiles_and_hit_ratio(tmp_path: Path) -> None:
    hot = [_request("a.tar.gz", ms, cold=int(ms == 900.0)) for ms in (10.0, 20.0, 30.0, 900.0)]
    _write(tmp_path, hot + [_request("a.tar.gz", 5.0, ok=0), _request("a.tar.gz", 50.0, cut_off=1),
                            _request("b.tar.gz", 40.0, cold=None), _request("", 1.0)])
    a, b = per_model(tmp_path)
    assert (a.target, a.requests, a.failures, a.cold) == ("a.tar.gz", 5, 1, 1)  # the cut-off request is left out
    assert a.p95_ms == percentile([10.0, 20.0, 30.0, 900.0], 95) and a.cold_p95_ms == 900.0
    assert a.hit_ratio == 0.75 and a.predicted_hit_ratio is None
    assert (b.requests, b.cold, b.hit_ratio, b.p50_ms) == (1, None, None, 40.0)  # the endpoint did not say


def test_a_last_row_cut_short_is_left_out_and_no_file_is_no_rows(tmp_path: Path) -> None:
    assert per_model(tmp_path) == []
    _write(tmp_path, [_request("a.tar.gz", 10.0), _request("a.tar.gz", 20.0)])
    with open(tmp_path / REQUESTS_FILE, "a") as handle:
        handle.write("3.0,0,1,a.tar.gz")  # the generator was killed while writing it
    (row,) = per_model(tmp_path)
    assert (row.requests, row.p50_ms) == (2, 15.0)
