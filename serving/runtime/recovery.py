"""Fault recovery for the multi-model endpoint: a Triton server that died, a broken one that
must be replaced, and a model whose worker process died.

:class:`Recovery` owns the restart lock and ``server_ready`` (cleared while a server is
restarted: loads wait on it, since a load during a restart would only fail), the watchdog that
looks for both faults between requests, and the worker processes of each loaded model.
A restart empties the table of loaded models: they reload on demand. A model whose worker died
is taken out of the table and unloaded through :class:`serving.runtime.admission.Admission` (never
with the room lock held across the unload); an unload that does not finish restarts the server.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import OrderedDict

import psutil

from mme.progress import Reporter
from serving.models.cache_entries import cache_key
from serving.runtime.admission import Admission, LoadedEntry
from serving.runtime.metrics import EndpointMetrics
from serving.triton.base import TritonServer
from serving.triton.container import ContainerUnreachable

# Triton's python backend answers this for a model whose stub process died (OOM killer, crash).
DEAD_WORKER_MARKERS = (b"Stub process", b"is not healthy")
DEAD_UNLOAD_TIMEOUT_S = 5.0  # then the server is restarted (see Recovery.drop_dead_model)


def dead_worker_reply(status: int, data: bytes) -> bool:
    """The container's answer says the model's worker process died."""
    return status != 200 and all(marker in data for marker in DEAD_WORKER_MARKERS)


class Recovery:
    def __init__(self, server: TritonServer, loaded: OrderedDict[str, LoadedEntry], admission: Admission,
                 metrics: EndpointMetrics, reporter: Reporter) -> None:
        self.server = server
        self.loaded = loaded  # the endpoint's table
        self.admission = admission
        self.metrics = metrics
        self.reporter = reporter
        self._recover_lock = asyncio.Lock()
        self.server_ready = asyncio.Event()  # cleared while a crashed server is restarted
        self.server_ready.set()

    async def recover(self, force: bool = False) -> None:
        """Restart a dead server (or, with ``force``, a broken live one); models reload on demand."""
        async with self._recover_lock:
            if self.server.is_running() and not force:
                return
            self.server_ready.clear()
            try:
                await self._restart(force)
            finally:
                self.server_ready.set()

    async def _restart(self, force: bool) -> None:
        if not force:
            self.reporter.warn(
                f"the Triton server exited (code {self.server.returncode}); restarting it, models reload on demand"
            )
        self.loaded.clear()
        # A dead or broken server gets no grace: its workers catch SIGTERM and would hold the
        # restart for the whole stop_grace_s before SIGKILL.
        await asyncio.to_thread(self.server.restart, grace_s=0.0)
        self.metrics.restarted()
        self.admission.record_memory()

    async def server_died(self, within_s: float = 1.0) -> bool:
        """Whether the server is dead, waiting up to ``within_s`` for it to be seen so: a
        connection reset by a crashing server can come before the process has exited."""
        deadline = time.perf_counter() + within_s
        while self.server.is_running():
            if time.perf_counter() > deadline:
                return False
            await asyncio.sleep(0.05)
        return True

    def worker_processes(self, target: str) -> tuple[psutil.Process, ...]:
        """The server's processes started for ``target``: python-backend stubs carry its model
        path, ``.../<hash>/model/...``, in their command line (blocking: call in a thread)."""
        marker = f"/{cache_key(target)}/"
        found = []
        for pid in self.server.pids():
            with contextlib.suppress(psutil.Error):
                proc = psutil.Process(pid)
                if pid != self.server.pid and any(marker in arg for arg in proc.cmdline()[1:2]):
                    found.append(proc)
        return tuple(found)

    async def drop_dead_model(self, target: str, entry: LoadedEntry) -> None:
        """A model whose worker died: out of the table and unloaded, so the next request loads
        it again like any cold request. Triton's python backend may never finish unloading a
        model whose stub died after a request reached it (measured with the wheel's 2.51: still
        waiting after 90 s); past ``DEAD_UNLOAD_TIMEOUT_S`` the server is restarted instead, as a
        broken container is replaced. The room lock is not held across the unload."""
        if not await self.admission.withdraw(target, entry):
            return  # someone else already did
        self.metrics.worker_failed()
        self.reporter.warn(f"the worker of {target} died; unloading it, it reloads on the next request")
        try:
            unload_s = await self.admission.unload_model(target, timeout_s=DEAD_UNLOAD_TIMEOUT_S)
            self.metrics.model_unloaded(unload_s, evicted=False)
        except ContainerUnreachable as exc:
            self.reporter.warn(f"Triton did not unload {target} ({type(exc).__name__}); restarting it, "
                               "models reload on demand")
            await self.recover(force=True)
        finally:
            await self.admission.withdrawn(target)

    async def watchdog(self, interval_s: float = 1.0) -> None:
        """Detect a crashed server, and models whose workers died, between requests too."""
        while True:
            await asyncio.sleep(interval_s)
            if not self.server.is_running():
                await self.recover()
                continue
            for target, entry in list(self.loaded.items()):
                if entry.inflight == 0 and entry.workers_dead():
                    await self.drop_dead_model(target, entry)
