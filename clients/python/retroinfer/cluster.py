"""The cluster directory in etcd (docs/deploy.md, "A cluster of kvstores"),
read from Python: which ri-kvstore nodes are alive and which node holds a
session, so that a client can connect to the node that owns a session.

It reads etcd through etcd's JSON gateway (``/v3/kv/range``, part of every
etcd 3.4 server) with the standard library only; the keys and values are
the ones the daemons write:

    /ri/<cluster>/nodes/<node>                 {"node", "addr", "host", "pool_total", ...}
    /ri/<cluster>/sessions/<node>/<id, 16 hex> {"worker", "label", "tokens", "created_ms"}

Example::

    d = Directory("etcd://127.0.0.1:2379", cluster="prod")
    node = d.find_session(0x1f)               # the node record, or None
    c = Client(node.addr, token=...)          # its control API
"""
import base64
import json
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Dict, List, Optional

from retroinfer.errors import InvalidArgument, Unavailable

__all__ = ["Directory", "Node", "SessionOwner"]


@dataclass(frozen=True)
class Node:
    """A live kvstore as it registered itself."""
    name: str
    addr: str
    host: str
    pool_total: int
    pool_used: int
    sessions: int
    epoch: int
    recovered: bool


@dataclass(frozen=True)
class SessionOwner:
    """A session record: the node holding it and the worker that placed it."""
    node: str
    session_id: int
    worker: str
    label: str
    tokens: int
    created_ms: int


def _b64(s: bytes) -> str:
    return base64.b64encode(s).decode()


def _prefix_end(prefix: bytes) -> bytes:
    """etcd's range end of every key starting with prefix (last byte + 1)."""
    b = bytearray(prefix)
    while b and b[-1] == 0xFF:
        b.pop()
    if not b:
        return b"\0"
    b[-1] += 1
    return bytes(b)


class Directory:
    """The directory of one cluster.  url: "etcd://host:port[,host:port]"
    (the first endpoint that answers is used)."""

    def __init__(self, url: str, cluster: str = "default", timeout: float = 5.0) -> None:
        eps = url[len("etcd://"):] if url.startswith("etcd://") else url
        self.endpoints = [e for e in eps.split(",") if e]
        if "://" in eps or not self.endpoints or \
                any(not e.rpartition(":")[0] or not e.rpartition(":")[2].isdigit() for e in self.endpoints):
            raise InvalidArgument("cluster URL %r is not etcd://host:port[,host:port...]" % url)
        if not cluster or "/" in cluster:
            raise InvalidArgument("cluster name %r is empty or holds '/'" % cluster)
        self.root = "/ri/%s/" % cluster
        self.timeout = timeout

    def _range(self, prefix: str) -> List[Dict[str, bytes]]:
        p = prefix.encode()
        body = json.dumps({"key": _b64(p), "range_end": _b64(_prefix_end(p))}).encode()
        last = None
        for ep in self.endpoints:
            req = urllib.request.Request("http://%s/v3/kv/range" % ep, data=body,
                                         headers={"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(req, timeout=self.timeout) as r:
                    got = json.loads(r.read())
            except (OSError, urllib.error.URLError, ValueError) as e:
                last = e
                continue
            return [{"key": base64.b64decode(kv["key"]), "value": base64.b64decode(kv.get("value", ""))}
                    for kv in got.get("kvs", [])]
        raise Unavailable("no etcd endpoint of %s answered: %s" % (",".join(self.endpoints), last))

    def nodes(self) -> List[Node]:
        """The live nodes, by name."""
        out = []
        for kv in self._range(self.root + "nodes/"):
            try:
                v = json.loads(kv["value"])
                out.append(Node(name=v["node"], addr=v["addr"], host=v.get("host", ""),
                                pool_total=int(v.get("pool_total", 0)), pool_used=int(v.get("pool_used", 0)),
                                sessions=int(v.get("sessions", 0)), epoch=int(v.get("epoch", 0)),
                                recovered=bool(v.get("recovered", False))))
            except (ValueError, KeyError, TypeError):
                continue  # a record this client cannot read is left out, not fatal
        return sorted(out, key=lambda n: n.name)

    def sessions(self, node: Optional[str] = None) -> List[SessionOwner]:
        """Every session record (of one node when given)."""
        prefix = self.root + "sessions/" + (node + "/" if node else "")
        out = []
        for kv in self._range(prefix):
            parts = kv["key"].decode(errors="replace")[len(self.root):].split("/")
            if len(parts) != 3:
                continue
            try:
                v = json.loads(kv["value"]) if kv["value"] else {}
                out.append(SessionOwner(node=parts[1], session_id=int(parts[2], 16), worker=v.get("worker", ""),
                                        label=v.get("label", ""), tokens=int(v.get("tokens", 0)),
                                        created_ms=int(v.get("created_ms", 0))))
            except (ValueError, TypeError):
                continue
        return out

    def find_session(self, session_id: int) -> Optional[Node]:
        """The live node holding session_id, or None (no record, or its node is gone)."""
        owners = [s.node for s in self.sessions() if s.session_id == session_id]
        if not owners:
            return None
        live = {n.name: n for n in self.nodes()}
        return next((live[o] for o in owners if o in live), None)
