"""The test suite's memory watchdog (tests/memory_watchdog.py): a test whose memory runs away
fails with a MemoryError at the line that was allocating, every thread's stack reaches the
terminal, and the tests after it still run. Checked in a pytest of its own, under a small limit."""

import os
import pathlib
import subprocess
import sys
import textwrap

import pytest

TESTS = pathlib.Path(__file__).resolve().parent

CONFTEST = f"""
import sys
sys.path.insert(0, {str(TESTS)!r})
import memory_watchdog

def pytest_configure(config):
    memory_watchdog.install(config)
"""

RUNAWAY = textwrap.dedent("""
    import time

    def test_runaway():
        chunks = []
        while True:  # filled bytes, so the pages are resident
            chunks.append(b"x" * 2**24)
            time.sleep(0.002)

    def test_after_it():
        assert sum(range(10)) == 45
""")


@pytest.mark.skipif(not pathlib.Path("/proc/self/statm").exists(), reason="the watchdog reads Linux's /proc")
def test_runaway_memory_fails_its_test_and_the_suite_goes_on(tmp_path):
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_runaway.py").write_text(RUNAWAY)
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
                         cwd=tmp_path, capture_output=True, text=True, timeout=120,
                         env={**_plain_environment(), "HALOATTN_TEST_MEMORY_LIMIT_GB": "0.6"})
    output = run.stdout + run.stderr
    assert "1 failed, 1 passed" in output, output
    assert "memory watchdog: test_runaway.py::test_runaway at" in output, output
    assert "MemoryError: the memory watchdog stopped test_runaway.py::test_runaway" in output, output
    # The traceback points at the allocating line, and the stack dump names the test's frame.
    assert 'chunks.append(b"x" * 2**24)' in output, output
    assert 'in test_runaway' in output, output


def _plain_environment():
    return {name: value for name, value in os.environ.items() if not name.startswith("PYTEST")}
