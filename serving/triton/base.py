"""The Triton server interface the local MME serves through, and its process lifecycle.

A :class:`TritonServer` runs one ``tritonserver`` the way SageMaker's Triton image starts it
in multi-model mode (its ``serve`` script: :mod:`serving.triton.sagemaker_serve`, honouring the
same ``SAGEMAKER_TRITON_*`` variables) over an empty model repository: models come and go
through ``POST /models`` and ``DELETE /models/NAME`` on the SageMaker port, as SageMaker's
front end drives them.

Subclasses say how the process is launched (:meth:`TritonServer.command` and
:meth:`TritonServer._environment`); this module starts it in its own process group, waits
for ``GET /ping`` (:func:`mme.polling.poll_until`), and stops the whole group (python-backend
stub processes included). Its configuration and errors live in :mod:`serving.triton.config`,
the process-group machinery in :mod:`serving.triton.processes`, and ``GET /ping`` in
:mod:`serving.triton.container` (the one home of Triton's HTTP).
"""

from __future__ import annotations

import abc
import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from pathlib import Path
from typing import IO, Callable, Sequence

import psutil

from mme.polling import poll_until
from serving.triton.config import (
    TritonServerConfig,
    TritonServerError,
    TritonStartupError,
    check_network,
    resolve_ports,
)
from serving.triton.container import ping_status
from serving.triton.netns import PrivateNetwork, host_network_warning, supervised
from serving.triton.processes import (
    INSTANCE_ENV,
    OWNER_ENV,
    alive,
    log_tail,
    owner_tag,
    process_group_members,
    terminate_group,
    tree_of,
)
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


class TritonServer(abc.ABC):
    """One tritonserver serving the SageMaker MME contract. Use as a context manager."""

    def __init__(self, config: TritonServerConfig | None = None) -> None:
        self.requested_config = config or TritonServerConfig()
        self.config = self.requested_config  # ports resolved at start()
        self._proc: subprocess.Popen | None = None
        self._workdir: Path | None = None
        self._log_handle: IO[bytes] | None = None
        self._known_children: dict[int, psutil.Process] = {}
        self._command_pid: int | None = None  # see pid
        self.instance_id = uuid.uuid4().hex  # in the environment of every process it starts
        self.startup_s: float | None = None
        # One-line messages for the user about how this server differs from SageMaker's
        # (filled by the first start(), not repeated on restarts); the caller prints them.
        self.notices: list[str] = []
        self._notices_done = False
        self._dropped: list[str] = []  # serve arguments this tritonserver lacks (last command())
        check_network(self.requested_config.network)
        # Triton in a network namespace of its own, its sockets from a broker (set by start()
        # when this kind and config.network ask for it; kept across restarts).
        self.network: PrivateNetwork | None = None

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
                               extra=[*config_arguments(self.config, bind_host), *kind_args],
                               default_model=self.config.default_model)
        kept, self._dropped = drop_unsupported(args, supported_flags(binary, self._environment()))
        return [str(binary), *kept, *self.config.extra_args]

    def binary_label(self) -> str:
        """How notices name this server's tritonserver."""
        return "this tritonserver"

    def _startup_notices(self) -> list[str]:
        notices = [f"{self.binary_label()} lacks {flag}; started without it (SageMaker's image would pass it)"
                   for flag in dropped_flags(self._dropped)]
        if self.isolates_network() and self.network is None:
            notices.append(host_network_warning(self.config.sagemaker_port))
        return notices

    def _before_start(self) -> None:
        """Checks and preparation that can fail with a clear MmeError."""

    def isolates_network(self) -> bool:
        """True when this kind starts tritonserver on this host's network, so that start() must
        put it in a private namespace (unless ``config.network`` is "host"). The docker kind
        has its container's network and publishes ports on 127.0.0.1 only."""
        return True

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
        """Base URL of the SageMaker port: ``http+netns://...`` when Triton runs in its own network namespace."""
        if self.network is not None:
            return self.network.url("sagemaker")
        return f"http://{self.config.host}:{self.config.sagemaker_port}"

    @property
    def kserve_url(self) -> str:
        """Triton's own HTTP (KServe v2) endpoint; TritonServerError when it is off."""
        if self.config.http_port is None:
            raise TritonServerError(
                f"{self.name} runs without Triton's HTTP/KServe endpoint (http_port=None, as SageMaker's image); "
                "use sagemaker_url, or create it with TritonServerConfig(http_port=0)"
            )
        if self.network is not None:
            return self.network.url("http")
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
        if self._workdir is None:  # restart() keeps the ports (and sockets) clients already know
            self.config = resolve_ports(self.requested_config)
            workdir = Path(tempfile.mkdtemp(prefix="mme-triton-"))
            try:
                if self.isolates_network() and self.config.network == "private":
                    self.network = PrivateNetwork(workdir, self.config.ports())
            except BaseException:
                shutil.rmtree(workdir, ignore_errors=True)
                raise
            self._workdir = workdir
        repository = self.config.model_repository or self._workdir / "model-repository"
        repository.mkdir(exist_ok=True)
        log_path = self.log_path
        assert log_path is not None  # the work directory exists from here on
        log_path.parent.mkdir(parents=True, exist_ok=True)
        argv = self.command(repository)
        argv = self.network.command(argv) if self.network is not None else supervised(argv)
        env = {**self._environment(), INSTANCE_ENV: self.instance_id, OWNER_ENV: owner_tag(psutil.Process())}
        if not self._notices_done:
            self.notices.extend(self._startup_notices())
            self._notices_done = True
        self._log_handle = open(log_path, "ab")
        self._command_pid = None
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
        self._command_pid = self._launched_pid()

    def _launched_pid(self) -> int | None:
        """The process of :meth:`command`: the broker's one child (the broker is its lifeline,
        and its socket broker when isolated)."""
        if self._proc is None:
            return None
        with contextlib.suppress(psutil.Error):
            children = psutil.Process(self._proc.pid).children()
            if children:
                return children[0].pid
        return None

    def _wait_until_healthy(self, started: float) -> None:
        """Return once ``GET /ping`` answers 200; TritonStartupError (the log's last lines in it)
        when the process exits first or ``startup_timeout_s`` passes. start() then stops it."""
        proc, log_path = self._proc, self.log_path
        assert proc is not None and log_path is not None  # called by start() right after Popen

        def healthy(elapsed: Callable[[], float]) -> bool | None:
            code = proc.poll()
            if code is not None:
                raise TritonStartupError(f"tritonserver exited with code {code} before answering GET /ping; "
                                         f"last log lines: {log_tail(log_path)}")
            return True if ping_status(self.sagemaker_url, timeout_s=1.0) == 200 else None

        def timed_out(waited: float) -> TritonStartupError:
            where = (f"127.0.0.1:{self.config.sagemaker_port}/ping in its private network namespace"
                     if self.network is not None else f"{self.sagemaker_url}/ping")
            return TritonStartupError(
                f"tritonserver did not answer GET {where} within "
                f"{self.config.startup_timeout_s:g} s (raise startup_timeout_s or check the log); "
                f"last log lines: {log_tail(log_path)}"
            )

        left = self.config.startup_timeout_s - (time.monotonic() - started)
        poll_until(healthy, timeout_s=left, interval_s=0.1, on_timeout=timed_out)

    def is_running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def returncode(self) -> int | None:
        """None while running (or never started); the exit status (-signal) once it ended."""
        return None if self._proc is None else self._proc.poll()

    @property
    def pid(self) -> int | None:
        """The process of :meth:`command` (tritonserver, or bash running SageMaker's serve script);
        None before start() and after stop()."""
        return None if self._proc is None else self._command_pid

    def pids(self) -> list[int]:
        """The server process and all its descendants (python-backend stubs), live ones only."""
        if self._proc is None:
            return []
        procs: dict[int, psutil.Process] = {}
        if self._proc.poll() is None:  # once reaped, its pid may be another process's
            procs.update((p.pid, p) for p in tree_of(self._proc.pid))
        # Children orphaned by a killed server are still in its process group.
        for member in process_group_members(self._proc.pid, self.instance_id):
            procs.setdefault(member.pid, member)
        self._known_children.update(procs)
        # The broker (the group's leader) is not the server: its memory is not Triton's.
        return sorted(pid for pid, proc in procs.items() if alive(proc) and pid != self._proc.pid)

    def stop(self, *, grace_s: float | None = None) -> None:
        """Stop the server and every process it started; idempotent. ``grace_s`` overrides
        ``stop_grace_s`` (Triton waits for loads in progress before it exits on SIGTERM)."""
        self._shutdown(grace_s)
        if self._workdir is not None:
            shutil.rmtree(self._workdir, ignore_errors=True)
            self._workdir = None
            self.network = None

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
            terminate_group(self._proc, self.instance_id, self._known_children.values(),
                            grace_s=self.config.stop_grace_s if grace_s is None else grace_s,
                            wait_s=self.config.stop_grace_s)
            self._known_children.clear()
            self._proc = None
        self._close_log()
        self._after_stop()

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
