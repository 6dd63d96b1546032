"""Client of the ri-kvstore control API (gRPC service retroinfer.v1.KvStore).

One :class:`Client` holds one gRPC channel to one daemon; it is thread-safe
(gRPC channels are) and cheap to keep for the life of a process.  Calls are
unary and short (session set-up, stats polling), each bounded by a timeout.

    from retroinfer import Client, Geometry

    with Client("127.0.0.1:7070", token="...") as kv:
        s = kv.create_session(Geometry(layers=30, kv_heads=3, head_dim=64), expected_tokens=32768)
        print(s.session_id, kv.stats().sessions)
        kv.drop_session(s.session_id)
"""
import os
from typing import List, Optional, Sequence, Tuple, Union

import grpc

from retroinfer._proto import pb, pb_grpc
from retroinfer.errors import from_rpc_error
from retroinfer.types import DType, Geometry, Health, ServingStatus, Session, SessionInfo, Stats

__all__ = ["Client", "DEFAULT_ADDRESS", "DEFAULT_TIMEOUT"]

DEFAULT_ADDRESS = "127.0.0.1:7070"
DEFAULT_TIMEOUT = 5.0  # seconds, as the C client's default

PathLike = Union[str, "os.PathLike[str]"]


def _read(path: Optional[PathLike], what: str) -> Optional[bytes]:
    if path is None:
        return None
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise ValueError("cannot read %s %s: %s" % (what, os.fspath(path), e.strerror)) from e


class Client:
    """A connection to one ri-kvstore's control API.

    Parameters:
        address: "host:port" of the daemon's gRPC listener (its --listen).
        token: bearer token, sent as ``authorization: Bearer TOKEN`` on every
            call but Health; needed when the daemon runs with --tokens-file.
        token_file: read the token from this file instead (surrounding
            whitespace stripped).
        tls: use TLS; implied by any of the three files below.  With no
            ca_file the system's trusted roots are used.
        ca_file: PEM CA bundle to verify the daemon's certificate.
        cert_file, key_file: PEM client certificate and key for mutual TLS
            (the daemon's --tls-ca); give both or neither.
        server_name: name to check the daemon's certificate against when it
            differs from the host in address.
        timeout: default per-call timeout in seconds (each method takes its
            own ``timeout=`` too); None waits without a bound.
        options: extra gRPC channel options, as for grpc.insecure_channel.

    Raises ValueError for contradictory or unreadable options.  Nothing is
    sent until the first call; an unreachable daemon then raises
    :class:`~retroinfer.errors.Unavailable`.
    """

    def __init__(self, address: str = DEFAULT_ADDRESS, *, token: Optional[str] = None,
                 token_file: Optional[PathLike] = None, tls: bool = False, ca_file: Optional[PathLike] = None,
                 cert_file: Optional[PathLike] = None, key_file: Optional[PathLike] = None,
                 server_name: Optional[str] = None, timeout: Optional[float] = DEFAULT_TIMEOUT,
                 options: Sequence[Tuple[str, object]] = ()) -> None:
        if token is not None and token_file is not None:
            raise ValueError("give token or token_file, not both")
        if token_file is not None:
            token = (_read(token_file, "token file") or b"").decode("utf-8").strip()
            if not token:
                raise ValueError("token file %s is empty" % os.fspath(token_file))
        if token is not None and (not token or any(c.isspace() for c in token)):
            raise ValueError("token must be non-empty and have no spaces")
        if (cert_file is None) != (key_file is None):
            raise ValueError("mutual TLS needs both cert_file and key_file")
        if timeout is not None and timeout <= 0:
            raise ValueError("timeout must be positive (seconds)")
        self.address = address
        self.timeout = timeout
        self._metadata: Tuple[Tuple[str, str], ...] = (("authorization", "Bearer " + token),) if token else ()
        opts = list(options)
        if tls or ca_file is not None or cert_file is not None:
            creds = grpc.ssl_channel_credentials(root_certificates=_read(ca_file, "CA file"),
                                                 private_key=_read(key_file, "key file"),
                                                 certificate_chain=_read(cert_file, "certificate file"))
            if server_name:
                opts.append(("grpc.ssl_target_name_override", server_name))
            self._channel = grpc.secure_channel(address, creds, options=opts)
        else:
            self._channel = grpc.insecure_channel(address, options=opts)
        self._stub = pb_grpc.KvStoreStub(self._channel)

    # -- plumbing -----------------------------------------------------------

    def _call(self, method: str, request, timeout: Optional[float], auth: bool = True):
        fn = getattr(self._stub, method)
        t = self.timeout if timeout is None else timeout
        try:
            return fn(request, timeout=t, metadata=self._metadata if auth else ())
        except grpc.RpcError as e:
            raise from_rpc_error(e, method, self.address) from None

    def close(self) -> None:
        """Close the channel; calls afterwards fail."""
        self._channel.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return "Client(%r)" % self.address

    # -- the API ------------------------------------------------------------

    def health(self, *, timeout: Optional[float] = None) -> Health:
        """Liveness, version, uptime, data-plane address, auth mode (no token needed)."""
        r = self._call("Health", pb.HealthRequest(), timeout, auth=False)
        return Health(status=ServingStatus(r.status), version=r.version, uptime_ms=r.uptime_ms,
                      dataplane_address=r.dataplane_address, auth_mode=r.auth_mode)

    def stats(self, *, timeout: Optional[float] = None) -> Stats:
        """Pool, disk, session and cache counters (sessions and clusters: the caller's tenant)."""
        r = self._call("Stats", pb.StatsRequest(), timeout)
        return Stats(**{f: getattr(r, f) for f in Stats.__dataclass_fields__})

    def create_session(self, geometry: Geometry, expected_tokens: int, label: str = "", *,
                       timeout: Optional[float] = None) -> Session:
        """Create a session for a model geometry, reserving quota for
        expected_tokens of K and V.  Raises InvalidArgument (a field out of
        range, named in ``details``), ResourceExhausted (over quota; nothing
        is created) or FailedPrecondition (draining)."""
        g = pb.Geometry(layers=geometry.layers, kv_heads=geometry.kv_heads, head_dim=geometry.head_dim,
                        dtype=int(geometry.dtype), page_tokens=geometry.page_tokens)
        r = self._call("CreateSession", pb.CreateSessionRequest(geometry=g, expected_tokens=expected_tokens,
                                                                label=label), timeout)
        return Session(session_id=r.session_id, dataplane_address=r.dataplane_address,
                       session_secret=bytes(r.session_secret))

    def drop_session(self, session_id: int, *, timeout: Optional[float] = None) -> int:
        """Drop a session; returns the bytes freed.  Raises NotFound for a
        missing id or another tenant's (an admin token drops any)."""
        return self._call("DropSession", pb.DropSessionRequest(session_id=session_id), timeout).bytes_freed

    def list_sessions(self, *, timeout: Optional[float] = None) -> List[SessionInfo]:
        """The caller's tenant's sessions (an admin token: every tenant's)."""
        r = self._call("ListSessions", pb.ListSessionsRequest(), timeout)
        return [SessionInfo(session_id=s.session_id, tenant=s.tenant,
                            geometry=Geometry(layers=s.geometry.layers, kv_heads=s.geometry.kv_heads,
                                              head_dim=s.geometry.head_dim, dtype=DType(s.geometry.dtype),
                                              page_tokens=s.geometry.page_tokens),
                            label=s.label, bytes_in_pool=s.bytes_in_pool, bytes_on_disk=s.bytes_on_disk,
                            clusters=s.clusters, created_unix_ms=s.created_unix_ms,
                            dataplane_address=s.dataplane_address) for s in r.sessions]

    def keep_alive(self, session_ids: Sequence[int], *, timeout: Optional[float] = None) -> Tuple[int, int]:
        """Renew the leases of these sessions (at most 4096 ids), for a
        session held without a data-plane connection: the daemon drops one
        that has neither for its lease period.  Returns (renewed, lease_ms):
        how many of the ids it still holds for the caller's tenant (the others
        are gone or another tenant's) and its lease period (0 = none)."""
        r = self._call("KeepAlive", pb.KeepAliveRequest(session_ids=list(session_ids)), timeout)
        return r.renewed, r.lease_ms

    def drain(self, *, timeout: Optional[float] = None) -> int:
        """Stop new sessions (existing ones keep working); returns the number
        still open.  Needs an admin token (else PermissionDenied)."""
        return self._call("Drain", pb.DrainRequest(), timeout).sessions_open

    @property
    def stub(self) -> "pb_grpc.KvStoreStub":
        """The generated stub, for calls this class does not wrap (pass
        ``metadata=`` yourself)."""
        return self._stub
