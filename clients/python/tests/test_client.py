"""The retroinfer Python client against the real ri-kvstore (conftest.py
starts it): every method, tokens and tenants, quotas, TLS and mutual TLS,
timeouts, and the typed errors.  Each test names what it proves; a wrong
status code, a missing field or a leak between tenants fails it."""
import json
import os
import socket
import subprocess
import sys
import threading
import time

import grpc
import pytest

import retroinfer
from retroinfer import (Client, DeadlineExceeded, DType, FailedPrecondition, Geometry, InvalidArgument, NotFound,
                        PermissionDenied, ResourceExhausted, RetroInferError, ServingStatus, Unauthenticated,
                        Unavailable)

from conftest import POOL, TOKENS, start_daemon

GEO = Geometry(layers=2, kv_heads=2, head_dim=64, dtype=DType.F16, page_tokens=8)


def client(d, who=None, **kw):
    return Client(d.address, token=TOKENS[who] if who else None, **kw)


def ids(sessions):
    return {s.session_id for s in sessions}


# -- health, sessions, stats ---------------------------------------------------

def test_health_needs_no_token_and_reports_serving(daemon):
    with client(daemon) as kv:
        h = kv.health()
    assert h.status == ServingStatus.SERVING and h.serving
    assert h.version
    assert h.auth_mode == "tokens"
    assert h.uptime_ms >= 0
    assert isinstance(h.dataplane_address, str)  # opaque: its format is the daemon's business


def test_create_list_drop_session(daemon):
    with client(daemon, "bob") as kv:
        s = kv.create_session(GEO, expected_tokens=1024, label="py-create")
        assert s.session_id > 0
        assert len(s.session_secret) == 16
        assert isinstance(s.dataplane_address, str)
        rows = {r.session_id: r for r in kv.list_sessions()}
        assert s.session_id in rows
        row = rows[s.session_id]
        assert row.tenant == "bob"
        assert row.label == "py-create"
        assert row.geometry == GEO
        assert row.created_unix_ms > 0
        kv.drop_session(s.session_id)
        assert s.session_id not in ids(kv.list_sessions())
        with pytest.raises(NotFound) as e:  # dropped twice
            kv.drop_session(s.session_id)
        assert e.value.code == grpc.StatusCode.NOT_FOUND
        assert e.value.method == "DropSession"
        assert str(s.session_id) in e.value.details


def test_keep_alive_renews_own_sessions_only(daemon):
    with client(daemon, "bob") as bob, client(daemon, "alice") as alice:
        s = bob.create_session(GEO, expected_tokens=64, label="py-keep")
        renewed, lease_ms = bob.keep_alive([s.session_id, 987654321])
        assert renewed == 1          # the unknown id is skipped
        assert lease_ms > 0
        assert alice.keep_alive([s.session_id]) == (0, lease_ms)  # another tenant's: not renewed
        with pytest.raises(InvalidArgument):
            bob.keep_alive(list(range(1, 4098)))
        bob.drop_session(s.session_id)
        assert bob.keep_alive([s.session_id])[0] == 0


def test_two_sessions_get_distinct_ids_and_secrets(daemon):
    with client(daemon, "bob") as kv:
        a = kv.create_session(GEO, 64, "a")
        b = kv.create_session(Geometry(4, 1, 128, "bf16"), 64, "b")
        try:
            assert a.session_id != b.session_id
            assert a.session_secret != b.session_secret
            rows = {r.session_id: r for r in kv.list_sessions()}
            assert rows[b.session_id].geometry == Geometry(4, 1, 128, DType.BF16, 8)
        finally:
            kv.drop_session(a.session_id)
            kv.drop_session(b.session_id)


def test_stats_counts_the_tenants_sessions(daemon):
    with client(daemon, "alice") as alice, client(daemon, "bob") as bob:
        before = alice.stats()
        assert before.pool_bytes_total == POOL
        s = alice.create_session(GEO, 256, "stats")
        try:
            mid = alice.stats()
            assert mid.sessions == before.sessions + 1
            assert mid.sessions_all == before.sessions_all + 1
            assert bob.stats().sessions == 0  # another tenant's count
        finally:
            alice.drop_session(s.session_id)
        assert alice.stats().sessions == before.sessions


def test_single_tenant_daemon_needs_no_token(tmp_path):
    d = start_daemon(tmp_path / "kvs", tokens=False)
    try:
        with client(d) as kv:
            assert kv.health().auth_mode == "single-tenant"
            s = kv.create_session(GEO, 64, "no-token")
            rows = {r.session_id: r for r in kv.list_sessions()}
            assert rows[s.session_id].tenant == "default"
            kv.drop_session(s.session_id)
    finally:
        assert d.stop() == 0, d.output()


# -- tokens and tenants --------------------------------------------------------

@pytest.mark.parametrize("call", ["stats", "list_sessions", "create_session", "drop_session", "drain"])
def test_wrong_token_is_unauthenticated(daemon, call):
    args = {"create_session": (GEO, 64), "drop_session": (1,)}.get(call, ())
    with Client(daemon.address, token="not-a-token-0000") as kv:
        with pytest.raises(Unauthenticated) as e:
            getattr(kv, call)(*args)
    assert e.value.code == grpc.StatusCode.UNAUTHENTICATED
    with client(daemon) as anon:  # no token at all
        with pytest.raises(Unauthenticated):
            getattr(anon, call)(*args)


def test_token_file(daemon, tmp_path):
    tf = tmp_path / "token"
    tf.write_text(TOKENS["bob"] + "\n")
    with Client(daemon.address, token_file=tf) as kv:
        assert kv.stats().pool_bytes_total == POOL


def test_tenant_cannot_see_or_drop_another_tenants_session(daemon):
    with client(daemon, "alice") as alice, client(daemon, "bob") as bob, client(daemon, "ops") as ops:
        s = alice.create_session(GEO, 64, "alice-only")
        try:
            assert s.session_id not in ids(bob.list_sessions())
            with pytest.raises(NotFound):
                bob.drop_session(s.session_id)
            assert s.session_id in ids(alice.list_sessions())  # still there
            assert s.session_id in ids(ops.list_sessions())  # an admin sees every tenant
        finally:
            alice.drop_session(s.session_id)


# -- bad requests and quotas ---------------------------------------------------

@pytest.mark.parametrize("geo,tokens,field", [
    (Geometry(0, 2, 64), 64, "layers"),
    (Geometry(2, 0, 64), 64, "kv_heads"),
    (Geometry(2, 2, 15), 64, "head_dim"),
    (Geometry(2, 2, 64, DType.UNSPECIFIED), 64, "dtype"),
    (Geometry(2, 2, 64, page_tokens=257), 64, "page_tokens"),
    (GEO, 0, "expected_tokens"),
])
def test_invalid_geometry_is_invalid_argument(daemon, geo, tokens, field):
    with client(daemon, "bob") as kv:
        before = ids(kv.list_sessions())
        with pytest.raises(InvalidArgument) as e:
            kv.create_session(geo, tokens)
        assert isinstance(e.value, ValueError)
        assert field in e.value.details
        assert ids(kv.list_sessions()) == before  # nothing created


def test_drop_session_zero_is_invalid_argument(daemon):
    with client(daemon, "bob") as kv, pytest.raises(InvalidArgument):
        kv.drop_session(0)


def test_quota_is_resource_exhausted(daemon):
    with client(daemon, "alice") as alice, client(daemon, "bob") as bob:
        before = alice.stats().sessions
        with pytest.raises(ResourceExhausted) as e:  # alice: 1 MiB quota
            alice.create_session(GEO, 65536, "too-big")
        assert "quota" in e.value.details
        assert alice.stats().sessions == before  # nothing created
        with pytest.raises(ResourceExhausted):  # bob: no quota, but the pool is 64 MiB
            bob.create_session(GEO, 1 << 20, "bigger-than-pool")
        small = alice.create_session(GEO, 64, "fits")  # quota left for a small one
        alice.drop_session(small.session_id)


# -- drain ---------------------------------------------------------------------

def test_drain_needs_admin_then_refuses_new_sessions(fresh_daemon):
    d = fresh_daemon
    with client(d, "alice") as alice, client(d, "ops") as ops:
        s = alice.create_session(GEO, 64, "before-drain")
        with pytest.raises(PermissionDenied):
            alice.drain()
        assert alice.health().status == ServingStatus.SERVING  # the refused drain did nothing
        assert ops.drain() == 1
        assert alice.health().status == ServingStatus.DRAINING
        with pytest.raises(FailedPrecondition):
            alice.create_session(GEO, 64, "after-drain")
        assert ids(alice.list_sessions()) == {s.session_id}  # existing sessions keep working
        alice.drop_session(s.session_id)
        assert ops.drain() == 0


# -- TLS -----------------------------------------------------------------------

@pytest.mark.tls
def test_tls(certs, tmp_path):
    d = start_daemon(tmp_path / "kvs", extra=["--tls-cert=%s" % (certs / "server.pem"),
                                              "--tls-key=%s" % (certs / "server.key")])
    try:
        with Client(d.address, ca_file=certs / "ca.pem", token=TOKENS["bob"]) as kv:
            assert kv.health().serving
            s = kv.create_session(GEO, 64, "over-tls")
            assert s.session_id in ids(kv.list_sessions())
            kv.drop_session(s.session_id)
        with Client(d.address, ca_file=certs / "ca.pem", server_name="localhost") as kv:
            assert kv.health().serving
        with Client(d.address, timeout=10) as plain, pytest.raises(Unavailable):
            plain.health()  # plaintext against a TLS listener
        with Client(d.address, ca_file=certs / "other.pem", timeout=10) as wrong, pytest.raises(Unavailable):
            wrong.health()  # a CA that did not sign the server's certificate
    finally:
        assert d.stop() == 0, d.output()


@pytest.mark.tls
def test_mutual_tls(certs, tmp_path):
    d = start_daemon(tmp_path / "kvs", extra=["--tls-cert=%s" % (certs / "server.pem"),
                                              "--tls-key=%s" % (certs / "server.key"),
                                              "--tls-ca=%s" % (certs / "ca.pem")])
    try:
        with Client(d.address, ca_file=certs / "ca.pem", cert_file=certs / "client.pem",
                    key_file=certs / "client.key", token=TOKENS["ops"]) as kv:
            assert kv.health().serving
            assert kv.stats().pool_bytes_total == POOL
        with Client(d.address, ca_file=certs / "ca.pem", timeout=10) as nocert, pytest.raises(Unavailable):
            nocert.health()  # the daemon demands a client certificate
        with pytest.raises(ValueError):
            Client(d.address, ca_file=certs / "ca.pem", cert_file=certs / "client.pem")  # no key
    finally:
        assert d.stop() == 0, d.output()


# -- timeouts, unreachable, error mapping --------------------------------------

def test_timeout_is_deadline_exceeded():
    """A listener that accepts and never answers: the call must end at its timeout."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    held = []
    stop = threading.Event()

    def accept():
        srv.settimeout(0.1)
        while not stop.is_set():
            try:
                held.append(srv.accept()[0])
            except OSError:
                pass

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    try:
        with Client("127.0.0.1:%d" % srv.getsockname()[1], timeout=30) as kv:
            t0 = time.monotonic()
            with pytest.raises(DeadlineExceeded) as e:
                kv.health(timeout=0.3)  # the per-call timeout wins over the client's 30 s
            assert time.monotonic() - t0 < 5
            assert isinstance(e.value, TimeoutError)
    finally:
        stop.set()
        t.join()
        for c in held:
            c.close()
        srv.close()


def test_unreachable_is_unavailable():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now
    with Client("127.0.0.1:%d" % port, timeout=10) as kv, pytest.raises(Unavailable) as e:
        kv.health()
    assert isinstance(e.value, ConnectionError)
    assert e.value.address == "127.0.0.1:%d" % port


def test_every_status_code_has_its_own_error_class():
    seen = set()
    for code in grpc.StatusCode:
        if code == grpc.StatusCode.OK:
            continue
        cls = retroinfer.errors.error_for_code(code)
        assert cls is not RetroInferError and issubclass(cls, RetroInferError), code
        assert cls.code == code
        seen.add(cls)
        assert cls("x", method="Stats", address="h:1").code == code
    assert len(seen) == len(grpc.StatusCode) - 1


def test_bad_options_are_value_errors(tmp_path):
    with pytest.raises(ValueError):
        Client("127.0.0.1:1", token="a", token_file=tmp_path / "t")
    with pytest.raises(ValueError):
        Client("127.0.0.1:1", token="has space")
    with pytest.raises(ValueError):
        Client("127.0.0.1:1", ca_file=tmp_path / "missing.pem")
    with pytest.raises(ValueError):
        Client("127.0.0.1:1", timeout=0)


# -- the command line ----------------------------------------------------------

def test_cli(daemon):
    env = dict(os.environ, RI_CTL_TOKEN=TOKENS["bob"])
    run = lambda *a: subprocess.run([sys.executable, "-m", "retroinfer", "--addr", daemon.address, *a],
                                    capture_output=True, text=True, env=env, timeout=30)
    r = run("create", "--layers", "2", "--kv-heads", "2", "--head-dim", "64", "--tokens", "64", "--label", "cli")
    assert r.returncode == 0, r.stderr
    sid = json.loads(r.stdout)["session_id"]
    r = run("sessions")
    assert r.returncode == 0 and sid in [s["session_id"] for s in json.loads(r.stdout)]
    assert run("drop", str(sid)).returncode == 0
    r = run("drop", str(sid))
    assert r.returncode == 1 and "NOT_FOUND" in r.stderr
    r = run("--token", "bad-token-000000", "stats")
    assert r.returncode == 1 and "UNAUTHENTICATED" in r.stderr
