"""The load-test master is not open to the network: it listens on loopback unless the user
names an address, and admits only workers that present the run's token (issue 13).

Every connection these tests make goes to 127.0.0.1."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import pytest

from bench.config import TOKEN_ENV
from bench.request import (
    BenchRequest,
    EndpointOptions,
    GeneratorOptions,
    LoadOptions,
    build_bench_config,
    worker_token_env,
)
from mme.cli import build_parser
from mme.errors import UsageError
from mme.network import is_loopback
from tests.bench.fake_endpoint import FakeEndpoint
from tests.bench.helpers import ROOT, bench_command, bench_env, free_port, read_run
from tests.listening import Watch

REFUSED_LINE = "mme: error: the bench master refused this worker: wrong or missing --token"

pytestmark = pytest.mark.integration  # real servers or whole commands: make test-integration


def test_every_socket_of_a_workers_run_listens_on_loopback(tmp_path):
    body = tmp_path / "body.json"
    body.write_text("{}")
    with FakeEndpoint() as endpoint:
        bench = subprocess.Popen(bench_command("--endpoint", "e", "--endpoint-url", endpoint.url, "--payload", str(body),
                                               "--model", "m", "--shape", "constant", "--users", "2", "--duration", "4",
                                               "--workers", "2", "--out", str(tmp_path / "out")),
                                 cwd=ROOT, env=bench_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        watch = Watch()
        try:
            watch.follow(bench.pid, until=lambda: bench.poll() is not None)
            out, err = bench.communicate(timeout=120)
        finally:
            if bench.poll() is None:
                bench.kill()
    assert bench.returncode == 0, err
    assert read_run(Path(out.strip().splitlines()[-1])).requests
    assert watch.most_processes >= 4  # mme bench, the generator (master) and its two workers were all watched
    assert watch.listening, "the master's listening socket was never seen"
    assert all(s.ip == "127.0.0.1" for s in watch.listening) and not watch.private, watch.listening


def _drain(stream, lines: list[str], seen: threading.Event) -> None:
    for line in stream:
        lines.append(line)
        if "waiting for" in line:
            seen.set()


def test_only_a_worker_with_the_token_joins(tmp_path):
    port = free_port()
    master_env = {**bench_env(), TOKEN_ENV: "env-secret"}
    outsider_env = bench_env()
    outsider_env.pop(TOKEN_ENV, None)
    with FakeEndpoint() as endpoint:
        master = subprocess.Popen(bench_command("--endpoint", "e", "--endpoint-url", endpoint.url, "--mode", "single",
                                                "--shape", "constant", "--users", "2", "--duration", "2",
                                                "--expect-workers", "1", "--master-port", str(port), "--out", str(tmp_path)),
                                  cwd=ROOT, env=master_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        err_lines: list[str] = []
        waiting = threading.Event()
        reader = threading.Thread(target=_drain, args=(master.stderr, err_lines, waiting), daemon=True)
        reader.start()
        try:
            assert waiting.wait(60), "".join(err_lines)
            watch = Watch()
            watch.look(master.pid)  # expecting remote workers does not open the master
            assert ("127.0.0.1", port) in {(s.ip, s.port) for s in watch.listening}
            assert all(s.ip == "127.0.0.1" for s in watch.listening), watch.listening
            line = next(x for x in err_lines if "waiting for" in x)
            assert f"mme bench-worker --master-host 127.0.0.1 --master-port {port} --token env-secret" in line
            assert "--master-bind-host" in line  # how to accept workers from other machines
            refused = [subprocess.run([sys.executable, "-m", "bench.worker", "--master-host", "127.0.0.1",
                                       "--master-port", str(port), *token], cwd=ROOT, env=outsider_env,
                                      capture_output=True, text=True, timeout=60)
                       for token in (["--token", "wrong"], [])]
            assert master.poll() is None  # still waiting: neither counted as the expected worker
            joined = subprocess.run([sys.executable, "-m", "mme", "bench-worker", "--master-host", "127.0.0.1",
                                     "--master-port", str(port)], cwd=ROOT, env=master_env,
                                    capture_output=True, text=True, timeout=90)
            out = master.stdout.read() if master.stdout else ""
            master.wait(timeout=60)
            reader.join(timeout=10)
        finally:
            if master.poll() is None:
                master.kill()
    err = "".join(err_lines)
    for worker in refused:
        assert worker.returncode != 0
        assert worker.stderr.strip().splitlines()[-1] == REFUSED_LINE, worker.stderr
    assert joined.returncode == 0, joined.stderr
    assert master.returncode == 0, err
    assert err.count("refused a worker from") == 2 and "wrong or missing token" in err
    run_dir = Path(out.strip().splitlines()[-1])
    run = read_run(run_dir)
    assert run.info.workers == 1 and run.requests and all(r.ok for r in run.requests)
    assert len({r.worker for r in run.requests}) == 1
    assert run.info.extra["refused_workers"] == 2
    for saved in run_dir.rglob("*"):  # the token is nowhere in what the run saved
        if saved.is_file():
            assert b"env-secret" not in saved.read_bytes(), saved


def _request(url: str, **generators) -> BenchRequest:
    return BenchRequest(endpoint=EndpointOptions("e", url, mode="single"),
                        load=LoadOptions(shape="constant", users=1, duration=1.0),
                        generators=GeneratorOptions(**generators))


def test_the_master_binds_loopback_unless_an_address_is_given():
    with FakeEndpoint() as endpoint:
        url = endpoint.url
        default = build_bench_config(_request(url), "", Path())
        remote = build_bench_config(_request(url, expect_workers=2, master_port=5557), "", Path())
        named = build_bench_config(_request(url, expect_workers=2, master_port=5557, master_bind_host="10.1.2.3"), "", Path())
        with pytest.raises(UsageError, match="--worker-token is empty"):
            build_bench_config(_request(url, worker_token=" "), "", Path())
    assert default.generators.master_bind_host == "127.0.0.1"
    assert remote.generators.master_bind_host == "127.0.0.1"  # expecting workers does not open the master
    assert named.generators.master_bind_host == "10.1.2.3"  # exactly the address given
    assert "token" not in named.to_json()  # the config file and the workers never see it


def test_the_token_option_reaches_the_generator_environment():
    # (The environment variable itself is exercised end to end above: master and worker read it.)
    parsed = BenchRequest.from_args(build_parser().parse_args(["bench", "--endpoint", "e", "--worker-token", "t1"]))
    token = parsed.generators.worker_token
    assert token == "t1" and worker_token_env(token) == {TOKEN_ENV: "t1"}
    assert worker_token_env(None) == {}  # the generator then reads $MME_BENCH_WORKER_TOKEN, or makes one
    worker = build_parser().parse_args(["bench-worker", "--master-host", "127.0.0.1", "--token", "t2"])
    assert worker.token == "t2"


@pytest.mark.parametrize("host, loopback", [("127.0.0.1", True), ("127.0.0.2", True), ("::1", True),
                                            ("localhost", True), ("0.0.0.0", False), ("10.1.2.3", False),
                                            ("bench-master.example", False)])
def test_which_bind_addresses_count_as_loopback(host, loopback):
    assert is_loopback(host) is loopback
