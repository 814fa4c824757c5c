"""The Triton server interface the local MME serves through, and its shared machinery.

A :class:`TritonServer` runs one ``tritonserver`` the way SageMaker's Triton image starts it
in multi-model mode (its ``serve`` script: :mod:`serving.triton.sagemaker_serve`, honouring the
same ``SAGEMAKER_TRITON_*`` variables) over an empty model repository: models come and go
through ``POST /models`` and ``DELETE /models/NAME`` on the SageMaker port, as SageMaker's
front end drives them.

Subclasses say how the process is launched (:meth:`TritonServer.command` and
:meth:`TritonServer._environment`); this module starts it in its own process group, waits
for ``GET /ping``, and stops the whole group (python-backend stub processes included).
"""

from __future__ import annotations

import abc
import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass, field, replace
from pathlib import Path, PurePosixPath
from typing import IO, Mapping, Sequence

import psutil

from mme.errors import MmeError
from serving.triton.sagemaker_serve import (
    config_arguments,
    drop_unsupported,
    dropped_flags,
    sagemaker_environment,
    script_gpu_count,
    serve_arguments,
    server_environment,
    supported_flags,
)

DEFAULT_SAGEMAKER_PORT = 8080
INSTANCE_ENV = "MME_TRITON_INSTANCE"  # marks the processes of one TritonServer object
OWNER_ENV = "MME_TRITON_OWNER"  # "<pid>:<create time>" of the process that started them
# Where SageMaker puts each target: <root>/<hash>/model. Triton 2.70+ refuses (400) a load
# url outside it (src/sagemaker_server.cc: model_path_regex_).
SAGEMAKER_MODEL_ROOT = PurePosixPath("/opt/ml/models")
SAGEMAKER_ROOT_REQUIRED_SINCE = (2, 70)
_ERROR_LINE = re.compile(r"[EF]\d{4} ")  # Triton's error/fatal log lines: E1203 08:11:13.24 ...


class TritonServerError(MmeError):
    """The Triton server could not be prepared, started or reached."""


class TritonStartupError(TritonServerError):
    """tritonserver exited or did not answer ``GET /ping`` in time."""


class ModelRootError(TritonServerError):
    """The model cache is somewhere this server cannot load models from."""


def parse_version(text: str | None) -> tuple[int, ...] | None:
    """``"2.71.0"`` -> (2, 71, 0); None for anything else."""
    parts = (text or "").strip().split(".")
    if len(parts) < 2 or not all(p.isdigit() for p in parts):
        return None
    return tuple(int(p) for p in parts)


@dataclass(frozen=True)
class TritonServerConfig:
    """How to run one Triton server. Port 0 means: pick a free port at start().

    The server is started as SageMaker's ``serve`` script starts it; ``sagemaker_env`` holds
    its ``SAGEMAKER_TRITON_*`` settings (and any other variable for the server's environment).
    A gRPC or metrics port given here becomes ``SAGEMAKER_TRITON_ALLOW_GRPC``/``_GRPC_PORT``
    (``_ALLOW_METRICS``/``_METRICS_PORT``) unless ``sagemaker_env`` or ``env`` sets them.
    """

    sagemaker_port: int = DEFAULT_SAGEMAKER_PORT  # the MME contract (SAGEMAKER_BIND_TO_PORT)
    http_port: int | None = 0  # Triton's own KServe v2 HTTP API; None: off, as in SageMaker's image
    grpc_port: int | None = 0  # None: gRPC off (unless SAGEMAKER_TRITON_ALLOW_GRPC says otherwise)
    metrics_port: int | None = 0  # None: Prometheus metrics off (unless SAGEMAKER_TRITON_ALLOW_METRICS)
    host: str = "127.0.0.1"  # Triton 2.51's SageMaker service ignores it and binds 0.0.0.0
    log_dir: Path | None = None  # None: a temporary directory removed by stop()
    log_verbose: int | None = None  # None: serve's (SAGEMAKER_TRITON_LOG_VERBOSE, default true)
    env: Mapping[str, str] = field(default_factory=dict, hash=False)  # extra environment
    sagemaker_env: Mapping[str, str] = field(default_factory=dict, hash=False)  # SAGEMAKER_TRITON_* etc.
    extra_args: tuple[str, ...] = ()  # after everything, SAGEMAKER_TRITON_ADDITIONAL_ARGS included
    startup_timeout_s: float = 60.0
    stop_grace_s: float = 10.0  # SIGTERM, then SIGKILL after this long

    def ports(self) -> dict[str, int | None]:
        return {
            "sagemaker": self.sagemaker_port,
            "http": self.http_port,
            "grpc": self.grpc_port,
            "metrics": self.metrics_port,
        }


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """``count`` distinct ports free on ``host`` now (all held open together, then released)."""
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind((host, 0))
            sockets.append(sock)
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def resolve_ports(config: TritonServerConfig) -> TritonServerConfig:
    """The config with every port given as 0 replaced by a free port."""
    wanted = [name for name, port in config.ports().items() if port == 0]
    if not wanted:
        return config
    chosen = dict(zip(wanted, free_ports(len(wanted), config.host)))
    return replace(
        config,
        sagemaker_port=chosen.get("sagemaker", config.sagemaker_port),
        http_port=chosen.get("http", config.http_port),
        grpc_port=chosen.get("grpc", config.grpc_port),
        metrics_port=chosen.get("metrics", config.metrics_port),
    )


def log_tail(path: Path, lines: int = 6, max_chars: int = 1500) -> str:
    """The last non-empty lines of a log as one line (`` | `` between lines), after the last
    two error lines when they come earlier (serve's ``--log-verbose=true`` buries them)."""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - 256 * 1024))
            text = fh.read().decode("utf-8", errors="replace")
    except FileNotFoundError:
        return "(no log written)"
    # Whitespace collapsed (Triton pads its tables to ~250 columns), table borders dropped.
    squeezed = (" ".join(line.split()) for line in text.splitlines())
    kept = [line for line in squeezed if line and not line.startswith("+-")]
    tail = kept[-lines:]
    errors = [line for line in kept[:-lines] if _ERROR_LINE.match(line)][-2:]
    shown = [*errors, "...", *tail] if errors else tail
    width = max(80, max_chars // max(1, len(shown)))
    return " | ".join(line[:width] for line in shown) or "(log is empty)"


def ping_status(url: str, timeout_s: float = 2.0) -> int | None:
    """HTTP status of ``GET url/ping``, or None when nothing answers."""
    try:
        with urllib.request.urlopen(f"{url}/ping", timeout=timeout_s) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except (urllib.error.URLError, ConnectionError, TimeoutError, socket.timeout):
        return None


def alive(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def process_group_members(pgid: int, instance_id: str) -> list[psutil.Process]:
    """Live processes of process group ``pgid`` that carry ``INSTANCE_ENV=instance_id``
    (children orphaned by a killed server included). The check of the variable, which every
    child inherits, guards against an unrelated group that reused the number."""
    members = []
    for proc in psutil.process_iter():
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied, ProcessLookupError):
            if os.getpgid(proc.pid) == pgid and alive(proc) and proc.environ().get(INSTANCE_ENV) == instance_id:
                members.append(proc)
    return members


def _owner_tag(proc: psutil.Process) -> str:
    return f"{proc.pid}:{proc.create_time():.3f}"


def _owner_alive(tag: str) -> bool:
    pid, _, created = tag.partition(":")
    try:
        return _owner_tag(psutil.Process(int(pid))) == tag
    except (psutil.Error, ValueError):
        return False


def sweep_orphans() -> list[int]:
    """Kill Triton servers and workers left by an mme process that died without stopping them
    (SIGKILL, OOM killer): processes of this user carrying :data:`OWNER_ENV` whose owner is gone.
    Returns their pids. Run before each start, so a killed ``mme serve`` leaks them only until
    the next one."""
    me = os.getuid()
    orphans = []
    for proc in psutil.process_iter(["uids"]):
        with contextlib.suppress(psutil.Error):
            if proc.info["uids"] is None or proc.info["uids"].real != me:
                continue
            tag = proc.environ().get(OWNER_ENV)
            if tag and not _owner_alive(tag) and alive(proc):
                orphans.append(proc)
    for proc in orphans:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    psutil.wait_procs(orphans, timeout=10)
    return [p.pid for p in orphans]


class TritonServer(abc.ABC):
    """One tritonserver serving the SageMaker MME contract. Use as a context manager."""

    def __init__(self, config: TritonServerConfig | None = None) -> None:
        self.requested_config = config or TritonServerConfig()
        self.config = self.requested_config  # ports resolved at start()
        self._proc: subprocess.Popen | None = None
        self._workdir: Path | None = None
        self._log_handle: IO[bytes] | None = None
        self._known_children: dict[int, psutil.Process] = {}
        self.instance_id = uuid.uuid4().hex  # in the environment of every process it starts
        self.startup_s: float | None = None
        # One-line messages for the user about how this server differs from SageMaker's
        # (filled by the first start(), not repeated on restarts); the caller prints them.
        self.notices: list[str] = []
        self._notices_done = False
        self._dropped: list[str] = []  # serve arguments this tritonserver lacks (last command())
        self.swept: list[int] = []  # orphans of earlier runs killed by the last start()

    # -- what subclasses provide --------------------------------------------------------
    @abc.abstractmethod
    def command(self, model_repository: Path) -> list[str]:
        """The argv that runs the server for ``self.config`` (ports resolved by start())."""

    def _serve_environment(self) -> dict[str, str]:
        """The environment SageMaker's serve script would run in: this process's, ``config.env``,
        then the SAGEMAKER_* settings (:func:`sagemaker_environment`)."""
        env = dict(os.environ)
        env.update(self.config.env)
        env.update(sagemaker_environment(self.config))
        return env

    def _environment(self) -> dict[str, str]:
        """Environment of the launched process: what tritonserver gets from serve (its ping-mode quirk)."""
        return server_environment(self._serve_environment())

    def _ported_command(self, binary: Path, model_repository: Path, kind_args: Sequence[str],
                        bind_host: str | None) -> list[str]:
        """``binary`` with the argv of serve's Python port, less the flags ``binary --help`` does not
        list (remembered for :attr:`notices`)."""
        env = self._serve_environment()
        args = serve_arguments(env, model_repository=str(model_repository), gpu_count=script_gpu_count(env),
                               extra=[*config_arguments(self.config, bind_host), *kind_args])
        kept, self._dropped = drop_unsupported(args, supported_flags(binary, self._environment()))
        return [str(binary), *kept, *self.config.extra_args]

    def binary_label(self) -> str:
        """How notices name this server's tritonserver."""
        return "this tritonserver"

    def _startup_notices(self) -> list[str]:
        return [f"{self.binary_label()} lacks {flag}; started without it (SageMaker's image would pass it)"
                for flag in dropped_flags(self._dropped)]

    def _before_start(self) -> None:
        """Checks and preparation that can fail with a clear MmeError."""

    def _before_terminate(self) -> None:
        """Called before the process group is signalled (the server may already be dead)."""

    def _after_stop(self) -> None:
        """Cleanup after the process group is gone."""

    @property
    def name(self) -> str:
        return type(self).__name__

    # -- where models are loaded from ------------------------------------------------------
    @classmethod
    def required_model_root(cls) -> Path | None:
        """The one directory this server loads models from (the cache must live there), or
        None when any directory will do."""
        return None

    def model_url(self, model_dir: Path) -> str:
        """The ``url`` for ``POST /models`` of a model directory on this host, as the server sees it."""
        return str(model_dir)

    # -- URLs -------------------------------------------------------------------------
    @property
    def sagemaker_url(self) -> str:
        return f"http://{self.config.host}:{self.config.sagemaker_port}"

    @property
    def kserve_url(self) -> str:
        """Triton's own HTTP (KServe v2) endpoint; TritonServerError when it is off."""
        if self.config.http_port is None:
            raise TritonServerError(
                f"{self.name} runs without Triton's HTTP/KServe endpoint (http_port=None, as SageMaker's image); "
                "use sagemaker_url, or create it with TritonServerConfig(http_port=0)"
            )
        return f"http://{self.config.host}:{self.config.http_port}"

    @property
    def log_path(self) -> Path | None:
        """stdout and stderr of the server (appended to across restarts); None before start()."""
        if self._workdir is None:
            return None
        return (self.config.log_dir or self._workdir) / f"tritonserver-{self.config.sagemaker_port}.log"

    # -- lifecycle --------------------------------------------------------------------
    def start(self) -> None:
        """Launch the server and return once ``GET /ping`` answers 200."""
        if self.is_running():
            raise TritonServerError(f"{self.name} is already running (pid {self.pid}); stop() it first")
        if self._proc is not None:  # it died on its own: clear what it left first
            self._shutdown()
        self._before_start()
        if self._workdir is None:  # restart() keeps the ports clients already know
            self.config = resolve_ports(self.requested_config)
            self._workdir = Path(tempfile.mkdtemp(prefix="mme-triton-"))
        repository = self._workdir / "model-repository"
        repository.mkdir(exist_ok=True)
        log_path = self.log_path
        assert log_path is not None  # the work directory exists from here on
        log_path.parent.mkdir(parents=True, exist_ok=True)
        argv = self.command(repository)
        self.swept = sweep_orphans()
        env = {**self._environment(), INSTANCE_ENV: self.instance_id, OWNER_ENV: _owner_tag(psutil.Process())}
        if not self._notices_done:
            self.notices.extend(self._startup_notices())
            self._notices_done = True
        self._log_handle = open(log_path, "ab")
        started = time.monotonic()
        try:
            self._proc = subprocess.Popen(
                argv,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=self._log_handle,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                cwd=self._workdir,
            )
        except OSError as exc:
            self._close_log()
            program = argv[0]
            raise TritonStartupError(f"cannot run {program}: {exc.strerror}; check the installation") from None
        try:
            self._wait_until_healthy(started)
        except BaseException:  # Ctrl-C included: leave nothing running
            self.stop()
            raise
        self.startup_s = time.monotonic() - started

    def _wait_until_healthy(self, started: float) -> None:
        deadline = started + self.config.startup_timeout_s
        proc, log_path = self._proc, self.log_path
        assert proc is not None and log_path is not None  # called by start() right after Popen
        while True:
            code = proc.poll()
            if code is not None:
                tail = log_tail(log_path)
                self.stop()
                raise TritonStartupError(
                    f"tritonserver exited with code {code} before answering GET /ping; last log lines: {tail}"
                )
            if ping_status(self.sagemaker_url, timeout_s=1.0) == 200:
                return
            if time.monotonic() > deadline:
                tail = log_tail(log_path)
                self.stop()
                raise TritonStartupError(
                    f"tritonserver did not answer GET {self.sagemaker_url}/ping within "
                    f"{self.config.startup_timeout_s:g} s (raise startup_timeout_s or check the log); "
                    f"last log lines: {tail}"
                )
            time.sleep(0.1)

    def is_running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def returncode(self) -> int | None:
        """None while running (or never started); the exit status (-signal) once it ended."""
        return None if self._proc is None else self._proc.poll()

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    def pids(self) -> list[int]:
        """The server process and all its descendants (python-backend stubs), live ones only."""
        if self._proc is None:
            return []
        procs: dict[int, psutil.Process] = {}
        if self._proc.poll() is None:  # once reaped, its pid may be another process's
            with contextlib.suppress(psutil.NoSuchProcess):
                root = psutil.Process(self._proc.pid)
                procs[root.pid] = root
                for child in root.children(recursive=True):
                    procs[child.pid] = child
        # Children orphaned by a killed server are still in its process group.
        for member in process_group_members(self._proc.pid, self.instance_id):
            procs.setdefault(member.pid, member)
        self._known_children.update(procs)
        return sorted(pid for pid, proc in procs.items() if alive(proc))

    def stop(self, *, grace_s: float | None = None) -> None:
        """Stop the server and every process it started; idempotent. ``grace_s`` overrides
        ``stop_grace_s`` (Triton waits for loads in progress before it exits on SIGTERM)."""
        self._shutdown(grace_s)
        if self._workdir is not None:
            shutil.rmtree(self._workdir, ignore_errors=True)
            self._workdir = None

    def restart(self, *, grace_s: float | None = None) -> None:
        """Stop (whatever is left of) the server and start it again on the same ports.

        Loaded models are not reloaded: like a replaced SageMaker container, it starts empty.
        ``grace_s`` overrides ``stop_grace_s`` (0: SIGKILL at once, for a server known broken).
        """
        self._shutdown(grace_s)
        if self._workdir is not None:
            shutil.rmtree(self._workdir / "model-repository", ignore_errors=True)
        self.start()

    def _shutdown(self, grace_s: float | None = None) -> None:
        if self._proc is not None:
            self._before_terminate()
            self._terminate_group(self.config.stop_grace_s if grace_s is None else grace_s)
            self._proc = None
        self._close_log()
        self._after_stop()

    def _terminate_group(self, grace_s: float) -> None:
        server = self._proc
        assert server is not None  # called by stop() only while there is a process
        pgid = server.pid  # start_new_session: the server leads its own group
        procs = {p.pid: p for p in process_group_members(pgid, self.instance_id)}
        if server.poll() is None:
            with contextlib.suppress(psutil.NoSuchProcess):
                root = psutil.Process(pgid)
                procs.update({p.pid: p for p in [root, *root.children(recursive=True)]})
        procs.update({pid: p for pid, p in self._known_children.items() if alive(p)})
        self._signal_all(pgid, list(procs.values()), signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            server.poll()
            if not any(alive(p) for p in procs.values()):
                break
            time.sleep(0.05)
        else:
            self._signal_all(pgid, [p for p in procs.values() if alive(p)], signal.SIGKILL)
        server.wait(timeout=self.config.stop_grace_s)
        psutil.wait_procs([p for p in procs.values() if p.pid != pgid], timeout=self.config.stop_grace_s)
        self._known_children.clear()

    @staticmethod
    def _signal_all(pgid: int, procs: Sequence[psutil.Process], sig: signal.Signals) -> None:
        if not procs:  # the group is gone: its number may belong to someone else now
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, sig)
        for proc in procs:  # members that left the group
            with contextlib.suppress(psutil.NoSuchProcess):
                proc.send_signal(sig)

    def _close_log(self) -> None:
        if self._log_handle is not None:
            self._log_handle.close()
            self._log_handle = None

    def __enter__(self) -> "TritonServer":
        self.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop()

    def __del__(self) -> None:
        proc = getattr(self, "_proc", None)
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
