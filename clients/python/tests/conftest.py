"""Fixtures: the real ri-kvstore on loopback, started per test module (or per
test where the test changes the daemon for good, as Drain does).

The daemon binary comes from $RI_KVSTORE (set by the ctest entry
python_client), else $RI_BUILD_DIR/bin/ri-kvstore, else build/bin/ri-kvstore
of the repository.  Each daemon gets its own folder (tokens file, port file,
certificates) and ephemeral ports, so runs may go in parallel.
"""
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Dict, List, Optional

import pytest

REPO = Path(__file__).resolve().parents[3]

# Tokens of the tokens-file daemon: alice has a 1 MiB quota, bob the daemon's
# default (none), ops is an admin (may Drain, sees every tenant).
TOKENS = {"alice": "alice-token-0123456789", "bob": "bob-token-0123456789", "ops": "ops-token-0123456789"}
TOKENS_FILE = ("# test tokens\n%(alice)s alice 1MiB\n%(bob)s bob\n%(ops)s ops - admin\n" % TOKENS)
POOL = 64 << 20  # --memory


def daemon_binary() -> Path:
    explicit = os.environ.get("RI_KVSTORE")
    if explicit:
        p = Path(explicit)
    else:
        p = Path(os.environ.get("RI_BUILD_DIR", REPO / "build")) / "bin" / "ri-kvstore"
    if not os.access(p, os.X_OK):
        pytest.fail("ri-kvstore not found at %s (build it with ./ri build, or set RI_KVSTORE)" % p,
                    pytrace=False)
    return p


class Daemon:
    """One ri-kvstore child process.  ``address`` is its gRPC host:port (from
    the port file), ``dir`` its folder."""

    def __init__(self, dir: Path, extra: List[str]) -> None:
        self.dir = dir
        self.port_file = dir / "ports"
        self.log = dir / "daemon.log"
        args = [str(daemon_binary()), "--listen=127.0.0.1:0", "--dataplane-listen=127.0.0.1:0",
                "--metrics-listen=off", "--memory=%d" % POOL, "--no-hugepages", "--dataplane-threads=1",
                "--drain-timeout-ms=2000", "--port-file=%s" % self.port_file] + extra
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        self.ports = self._wait_ports(15.0)
        self.address = self.ports["grpc"]

    def _wait_ports(self, limit: float) -> Dict[str, str]:
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError("ri-kvstore exited %d at start:\n%s" % (self.proc.returncode, self.output()))
            try:
                lines = self.port_file.read_text().splitlines()
            except FileNotFoundError:
                lines = []
            ports = dict(l.split("=", 1) for l in lines if "=" in l)
            if ports.get("grpc"):
                return ports
            time.sleep(0.02)
        self.proc.kill()
        raise RuntimeError("ri-kvstore did not serve within %.0f s:\n%s" % (limit, self.output()))

    def output(self) -> str:
        try:
            return self.log.read_text(errors="replace")
        except OSError:
            return ""

    def stop(self) -> Optional[int]:
        """SIGTERM, then wait (SIGKILL after 10 s); returns the exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                return None
        return self.proc.returncode


def start_daemon(dir: Path, tokens: bool = True, extra: Optional[List[str]] = None) -> Daemon:
    dir.mkdir(parents=True, exist_ok=True)
    args = list(extra or [])
    if tokens:
        tf = dir / "tokens"
        tf.write_text(TOKENS_FILE)
        tf.chmod(0o600)
        args.append("--tokens-file=%s" % tf)
    return Daemon(dir, args)


def _stopped_cleanly(d: Daemon) -> None:
    rc = d.stop()
    assert rc == 0, "ri-kvstore exited %r at SIGTERM:\n%s" % (rc, d.output())


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    """A tokens-file daemon (TOKENS) shared by a module's tests."""
    d = start_daemon(tmp_path_factory.mktemp("kvs"))
    yield d
    _stopped_cleanly(d)


@pytest.fixture
def fresh_daemon(tmp_path):
    """A tokens-file daemon of the test's own (for Drain, which cannot be undone)."""
    d = start_daemon(tmp_path / "kvs")
    yield d
    _stopped_cleanly(d)


@pytest.fixture(scope="session")
def certs(tmp_path_factory):
    """Throw-away CA, server (127.0.0.1/localhost) and client certificates,
    made by the C tests' script; the tests that use it skip without openssl
    (the ctest runner then reports the whole run as skipped, not passed)."""
    d = tmp_path_factory.mktemp("certs")
    r = subprocess.run(["sh", str(REPO / "tests" / "kvstore_ctl" / "make_test_certs.sh"), str(d)],
                       capture_output=True, text=True)
    if r.returncode == 77:
        pytest.skip("openssl not installed: no test certificates")
    assert r.returncode == 0, r.stderr
    return d


# Strict mode for ctest (RI_PYTEST_NO_SKIP=1): a skipped test fails the run,
# so a test that silently stopped running cannot pass as green.
_skipped: List[str] = []


def pytest_runtest_logreport(report):
    if report.skipped:
        _skipped.append(report.nodeid)


def pytest_sessionfinish(session, exitstatus):
    if os.environ.get("RI_PYTEST_NO_SKIP") == "1" and _skipped and exitstatus == 0:
        print("\nFAIL (RI_PYTEST_NO_SKIP=1): skipped: %s" % ", ".join(_skipped))
        session.exitstatus = 1


def pytest_configure(config):
    config.addinivalue_line("markers", "tls: needs openssl for test certificates (the certs fixture)")
