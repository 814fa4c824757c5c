"""The namespace broker's Unix socket under many callers at once (serving/triton/container_transport.py):
with a timeout, Linux answers a connect to a listener whose backlog is full with EAGAIN at once, so
a slow broker (one core, capacity's 200 callers) used to fail requests. They wait for room now,
up to their timeout. The broker's own ``hand_out`` answers, on a real Unix socket."""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path

import pytest

from serving.triton.container_transport import netns_socket
from serving.triton.netns_broker import hand_out


def _full_listener(path: Path) -> tuple[socket.socket, socket.socket]:
    """A listener with room for one pending connection, and the connection that takes it."""
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(0)
    pending = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    pending.connect(str(path))
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(1.0)
    with probe, pytest.raises(BlockingIOError):  # what a caller met before: EAGAIN at once
        probe.connect(str(path))
    return server, pending


def test_a_caller_waits_for_room_in_a_full_backlog_and_gets_its_socket(tmp_path):
    server, pending = _full_listener(tmp_path / "broker.sock")
    got: list[socket.socket | BaseException] = []

    def call() -> None:
        try:
            got.append(netns_socket(str(tmp_path / "broker.sock"), 5.0))
        except BaseException as exc:  # handed to the test's thread, which asserts on it
            got.append(exc)

    caller = threading.Thread(target=call)
    caller.start()
    time.sleep(0.3)
    assert not got  # still waiting for room: not failed
    threading.Thread(target=hand_out, args=(server, 8000), daemon=True).start()  # the broker catches up
    caller.join(5.0)
    with pending, server:
        assert len(got) == 1 and isinstance(got[0], socket.socket), got
        with got[0] as made:
            assert made.family == socket.AF_INET and made.type == socket.SOCK_STREAM


def test_a_backlog_that_stays_full_is_a_timeout_that_names_the_broker(tmp_path):
    server, pending = _full_listener(tmp_path / "broker.sock")
    started = time.monotonic()
    with server, pending, pytest.raises(TimeoutError, match=r"broker\.sock accepted no connection in 0\.3 s"):
        netns_socket(str(tmp_path / "broker.sock"), 0.3)
    assert 0.25 <= time.monotonic() - started < 2.0


def test_a_broker_that_is_gone_fails_at_once(tmp_path):
    started = time.monotonic()
    with pytest.raises(FileNotFoundError):
        netns_socket(str(tmp_path / "gone.sock"), 5.0)
    assert time.monotonic() - started < 1.0
