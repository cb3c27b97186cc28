"""The XID errors NVML reports, watched on a thread, and merged with the kernel log's."""

from __future__ import annotations

import ctypes
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import pynvml

from gpuconsole.core.clock import Clock, wall_clock
from gpuconsole.core.model import XidEvent
from gpuconsole.telemetry.nvml.mapping import _REFUSED, Handle, _nvml

# --- XID events ----------------------------------------------------------------------------------


def _succeeds(function: Callable[..., Any], *args: Any) -> bool:
    try:
        function(*args)
    except _REFUSED:
        return False
    return True


def _address(handle: Handle) -> int | None:
    """A device handle's pointer value: NVML hands out one handle per device."""
    return ctypes.cast(handle, ctypes.c_void_p).value


class XidWatcher:
    """A daemon thread that collects the XID errors NVML reports, and the kernel log's.

    It registers ``nvmlEventTypeXidCriticalError`` on every GPU that accepts it and waits for
    events ``wait_ms`` at a time until `stop`, keeping the latest ``capacity`` of them. Every
    ``kernel_interval_s`` (and right after an NVML event, to get the driver's message for it) it
    re-reads the kernel log through ``kernel_log``, if given. Without NVML events (no GPU accepts
    them, or NVML is not initialised) it still reads the kernel log.
    """

    def __init__(
        self,
        handles: Mapping[int, Handle],
        kernel_log: Callable[[], Sequence[XidEvent]] | None = None,
        *,
        wait_ms: int = 500,
        kernel_interval_s: float = 60.0,
        capacity: int = 256,
        clock: Clock = wall_clock,
    ) -> None:
        self._handles = dict(handles)
        self._kernel_log = kernel_log
        self._wait_ms = wait_ms
        self._kernel_interval_s = kernel_interval_s
        self._clock = clock
        self._events: deque[XidEvent] = deque(maxlen=capacity)
        self._kernel: tuple[XidEvent, ...] = ()
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._gpu_at: dict[int | None, int] = {}
        self._thread = threading.Thread(target=self._run, name="gpuconsole-xid", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 2.0) -> None:
        self._stopping.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def events(self) -> tuple[XidEvent, ...]:
        """The XID events NVML reported since `start`, oldest first."""
        with self._lock:
            return tuple(self._events)

    def kernel_events(self) -> tuple[XidEvent, ...]:
        """The XID events of the latest kernel log read."""
        return self._kernel

    def _run(self) -> None:
        event_set = self._register()
        next_kernel_read = 0.0
        try:
            while not self._stopping.is_set():
                if self._kernel_log is not None and time.monotonic() >= next_kernel_read:
                    self._read_kernel_log()
                    next_kernel_read = time.monotonic() + self._kernel_interval_s
                if event_set is None:
                    self._stopping.wait(self._wait_ms / 1000)
                elif self._wait(event_set):
                    next_kernel_read = 0.0
        finally:
            if event_set is not None:
                _nvml(pynvml.nvmlEventSetFree, event_set)

    def _register(self) -> Any | None:
        """An event set with XID events of every GPU that accepts them; None if none does."""
        event_set = _nvml(pynvml.nvmlEventSetCreate)
        if event_set is None:
            return None
        xid = pynvml.nvmlEventTypeXidCriticalError
        for index, handle in self._handles.items():
            if _succeeds(pynvml.nvmlDeviceRegisterEvents, handle, xid, event_set):
                self._gpu_at[_address(handle)] = index
        if not self._gpu_at:
            _nvml(pynvml.nvmlEventSetFree, event_set)
            return None
        return event_set

    def _wait(self, event_set: Any) -> bool:
        """Wait for one event; True when an XID came."""
        try:
            data = pynvml.nvmlEventSetWait(event_set, self._wait_ms)
        except pynvml.NVMLError_Timeout:
            return False
        except _REFUSED:
            # A GPU gone bad can make every wait fail at once: do not spin on it.
            self._stopping.wait(self._wait_ms / 1000)
            return False
        if not data.eventType & pynvml.nvmlEventTypeXidCriticalError:
            return False
        event = XidEvent(
            xid=int(data.eventData), gpu=self._gpu_at.get(_address(data.device)), time=self._clock()
        )
        with self._lock:
            self._events.append(event)
        return True

    def _read_kernel_log(self) -> None:
        assert self._kernel_log is not None
        try:
            self._kernel = tuple(self._kernel_log())
        except Exception:  # a failing reader must not end the thread that waits for NVML events
            return


def merge_xids(
    kernel: Iterable[XidEvent], nvml: Iterable[XidEvent], window_s: float = 5.0
) -> tuple[XidEvent, ...]:
    """The kernel log's XID events (they carry the driver's message) and those of NVML's that
    the log lacks, oldest first.

    An NVML event is the logged one when a logged event has the same XID and GPU within
    ``window_s``: the two stamps come from different clocks (and, for plain dmesg, from boot
    time plus seconds since boot).
    """
    logged = list(dict.fromkeys(kernel))
    unlogged = [
        event
        for event in nvml
        if not any(
            seen.xid == event.xid
            and seen.gpu == event.gpu
            and abs(seen.time - event.time) <= window_s
            for seen in logged
        )
    ]
    return tuple(sorted(logged + unlogged, key=lambda event: event.time))
