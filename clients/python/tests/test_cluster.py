"""retroinfer.cluster against a real etcd and a real ri-kvstore started with
--cluster: the directory lists the node as it registered itself, finds the
node of a session record in the format the workers write, and says clearly
when etcd cannot be reached."""
import json
import os
import shutil
import socket
import subprocess
import time

import pytest

from retroinfer import Client, Geometry, InvalidArgument, Unavailable
from retroinfer.cluster import Directory

from conftest import start_daemon


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def etcdctl(port, *args):
    return subprocess.run(["etcdctl", "--endpoints", "127.0.0.1:%d" % port] + list(args), capture_output=True,
                          text=True, env=dict(os.environ, ETCDCTL_API="3"), timeout=20)


@pytest.fixture
def etcd(tmp_path):
    if shutil.which("etcd") is None or shutil.which("etcdctl") is None:
        pytest.skip("etcd is not installed (Debian etcd-server, etcd-client)")
    client, peer = free_port(), free_port()
    with open(tmp_path / "etcd.log", "wb") as log:
        p = subprocess.Popen(["etcd", "--name", "t", "--data-dir", str(tmp_path / "etcd"),
                              "--listen-client-urls", "http://127.0.0.1:%d" % client,
                              "--advertise-client-urls", "http://127.0.0.1:%d" % client,
                              "--listen-peer-urls", "http://127.0.0.1:%d" % peer,
                              "--initial-advertise-peer-urls", "http://127.0.0.1:%d" % peer,
                              "--initial-cluster", "t=http://127.0.0.1:%d" % peer],
                             stdout=log, stderr=subprocess.STDOUT)
    try:
        for _ in range(150):
            if etcdctl(client, "endpoint", "health").returncode == 0:
                break
            time.sleep(0.2)
        else:
            pytest.fail("etcd did not answer in 30 s")
        yield client
    finally:
        p.terminate()
        p.wait(10)


def test_directory_lists_the_registered_node_and_finds_a_session(etcd, tmp_path):
    d = start_daemon(tmp_path, tokens=False,
                     extra=["--cluster=etcd://127.0.0.1:%d" % etcd, "--cluster-name=py", "--node-name=n1"])
    try:
        directory = Directory("etcd://127.0.0.1:%d" % etcd, cluster="py")
        nodes = []
        for _ in range(50):
            nodes = directory.nodes()
            if nodes:
                break
            time.sleep(0.1)
        assert [n.name for n in nodes] == ["n1"]
        assert nodes[0].addr == d.address
        assert nodes[0].pool_total > 0 and nodes[0].epoch > 0 and not nodes[0].recovered
        # a session on the node, and its owner record as a worker writes it
        with Client(nodes[0].addr) as c:
            s = c.create_session(Geometry(layers=2, kv_heads=1, head_dim=64), 128, "py-cluster")
        rec = {"worker": "w1", "label": "py-cluster", "tokens": 128, "created_ms": int(time.time() * 1000)}
        key = "/ri/py/sessions/n1/%016x" % s.session_id
        assert etcdctl(etcd, "put", key, json.dumps(rec)).returncode == 0
        owners = directory.sessions()
        assert [(o.node, o.session_id, o.worker, o.tokens) for o in owners] == [("n1", s.session_id, "w1", 128)]
        assert directory.find_session(s.session_id).addr == d.address
        assert directory.find_session(s.session_id + 1) is None
        # a clean stop leaves the directory at once
        d.stop()
        assert directory.nodes() == []
        assert directory.find_session(s.session_id) is None  # its node is gone
    finally:
        d.stop()


def test_directory_errors_are_clear():
    with pytest.raises(InvalidArgument):
        Directory("http://nothing")
    with pytest.raises(InvalidArgument):
        Directory("etcd://127.0.0.1:1", cluster="a/b")
    with pytest.raises(Unavailable, match="no etcd endpoint"):
        Directory("etcd://127.0.0.1:%d" % free_port(), timeout=1.0).nodes()
