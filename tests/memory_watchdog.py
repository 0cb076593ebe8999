"""A pytest plugin that turns a runaway test's memory into that test's failure, with a traceback.

Twice (2026-11-29, 03:10 and 13:00 UTC) the CPU suite's process grew to 23 GB inside one
interpreter test and the kernel's OOM killer ended the whole run, with no trace of where; the
same test reran at its usual 0.65 GB. Here a thread samples the process's resident memory; past
the limit it prints every thread's stack to the terminal (pytest's capture would lose it if the
process dies anyway) and raises MemoryError in the main thread, so the test fails where it was
allocating and the rest of the suite runs on.

The limit: HALOATTN_TEST_MEMORY_LIMIT_GB, by default half the machine's memory (12 GB on CI's
24 GB; the suite peaks near 1 GB). Linux only: elsewhere it does nothing.
"""

import contextlib
import faulthandler
import os
import signal
import sys
import threading
import time

POLL_SECONDS = 0.2
PAGE_BYTES = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def _resident_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * PAGE_BYTES


def _limit_bytes() -> int:
    configured = os.environ.get("HALOATTN_TEST_MEMORY_LIMIT_GB")
    if configured:
        return int(float(configured) * 2**30)
    with open("/proc/meminfo") as meminfo:
        total_kib = int(meminfo.readline().split()[1])  # first line: MemTotal
    return total_kib * 1024 // 2


class MemoryWatchdog:
    def __init__(self, config):
        self.config = config
        self.limit = _limit_bytes()
        self.test = "(between tests)"
        self.fired_at = None

    def pytest_runtest_protocol(self, item):
        self.test = item.nodeid

    def start(self):
        signal.signal(signal.SIGUSR1, self._raise_in_main_thread)
        threading.Thread(target=self._watch, name="memory-watchdog", daemon=True).start()

    def _raise_in_main_thread(self, signum, frame):
        raise MemoryError(
            f"the memory watchdog stopped {self.test}: resident memory {self.fired_at / 2**30:.1f} GB passed "
            f"the limit of {self.limit / 2**30:.1f} GB (HALOATTN_TEST_MEMORY_LIMIT_GB); the traceback shows "
            f"where the test was when it did")

    def _watch(self):
        armed = True
        while True:
            time.sleep(POLL_SECONDS)
            resident = _resident_bytes()
            if armed and resident > self.limit:
                armed = False  # once per excursion: re-armed when the memory is back under the limit
                self.fired_at = resident
                self._report(resident)
                signal.pthread_kill(threading.main_thread().ident, signal.SIGUSR1)
            elif resident < self.limit * 0.8:
                armed = True

    def _report(self, resident):
        capture = self.config.pluginmanager.getplugin("capturemanager")  # None under -p no:capture
        with capture.global_and_fixture_disabled() if capture else contextlib.nullcontext():
            sys.stderr.write(f"\nmemory watchdog: {self.test} at {resident / 2**30:.1f} GB resident "
                             f"(limit {self.limit / 2**30:.1f} GB); every thread's stack:\n")
            sys.stderr.flush()
            faulthandler.dump_traceback(file=sys.stderr, all_threads=True)


def install(config) -> None:
    """Called from conftest's pytest_configure. Only from the main thread (signal handlers are set
    there): a pytest-xdist worker that runs its tests elsewhere goes without."""
    if not (sys.platform.startswith("linux") and os.path.exists("/proc/self/statm")):
        return
    if threading.current_thread() is not threading.main_thread():
        return
    watchdog = MemoryWatchdog(config)
    config.pluginmanager.register(watchdog, "haloattn-memory-watchdog")
    watchdog.start()
