"""TritonServer's lifecycle without Triton: a small Python program stands in for tritonserver
(it answers GET /ping on $SAGEMAKER_BIND_TO_PORT, or never does), so the start wait
(mme.polling.poll_until), the log tail in its errors and the process-group stop run for real, fast."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import psutil
import pytest

from serving.triton.base import TritonServer
from serving.triton.config import TritonServerConfig, TritonStartupError
from serving.triton.processes import INSTANCE_ENV, log_tail

PINGS = """
import http.server, os, subprocess, sys
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])  # a python-backend stub
class Ping(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.send_header("Content-Length", "0"); self.end_headers()
    def log_message(self, *args):
        pass
print("I1203 stand-in serving", flush=True)
http.server.HTTPServer(("127.0.0.1", int(os.environ["SAGEMAKER_BIND_TO_PORT"])), Ping).serve_forever()
"""
SILENT = "import time; print('E1203 12:00:00.000 1 server.cc:1] stand-in never answers', flush=True); time.sleep(120)"
EXITS = "import sys; print('E1203 12:00:00.000 1 server.cc:1] stand-in failed to bind', flush=True); sys.exit(3)"


class StandIn(TritonServer):
    """Runs ``python -c program`` in place of tritonserver."""

    def __init__(self, program: str, **config) -> None:
        super().__init__(TritonServerConfig(sagemaker_port=0, http_port=None, grpc_port=None, metrics_port=None,
                                            stop_grace_s=2.0, **config))
        self.program = program

    def command(self, model_repository: Path) -> list[str]:
        return [sys.executable, "-c", self.program]


def _ours(server: StandIn) -> list[psutil.Process]:
    """Live processes carrying this server's instance marker."""
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.environ().get(INSTANCE_ENV) == server.instance_id and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


def test_start_waits_for_ping_and_stop_ends_the_whole_group() -> None:
    server = StandIn(PINGS, startup_timeout_s=20.0)
    with server:
        assert server.is_running() and server.startup_s is not None and server.startup_s > 0
        deadline = time.monotonic() + 10
        while len(server.pids()) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(server.pids()) == 2  # the server and its child
        assert server.log_path is not None and "stand-in serving" in log_tail(server.log_path)
    assert not server.is_running() and server.pids() == []
    assert _ours(server) == []  # the child went with the group


def test_a_server_that_never_answers_ping_times_out_with_its_log_tail() -> None:
    server = StandIn(SILENT, startup_timeout_s=0.8)
    started = time.monotonic()
    with pytest.raises(TritonStartupError) as info:
        server.start()
    assert time.monotonic() - started < 8
    message = str(info.value)
    assert "did not answer GET 127.0.0.1:" in message and "/ping in its private network namespace within 0.8 s" in message
    assert "stand-in never answers" in message and "\n" not in message
    assert not server.is_running() and _ours(server) == []


def test_a_server_that_exits_reports_its_code_and_log_tail() -> None:
    server = StandIn(EXITS, startup_timeout_s=20.0)
    with pytest.raises(TritonStartupError, match=r"exited with code 3 before answering GET /ping; .*failed to bind"):
        server.start()
    assert server.returncode is None and server.pids() == []  # stopped: nothing left to report on
