"""Plain value types of the control API (proto/retroinfer.proto).

The client returns these instead of the generated protobuf messages, so
code using it does not depend on the generated module.  Field names and
meanings are the proto's.
"""
import enum
from dataclasses import dataclass, field
from typing import Union

__all__ = ["DType", "ServingStatus", "Geometry", "Health", "Stats", "Session", "SessionInfo"]


class DType(enum.IntEnum):
    """K/V element type (proto enum DType)."""
    UNSPECIFIED = 0
    F16 = 1
    BF16 = 2

    @classmethod
    def parse(cls, v: Union["DType", int, str]) -> "DType":
        """A DType from itself, its number, or a name ("f16", "bf16", "DTYPE_F16")."""
        if isinstance(v, str):
            name = v.upper()
            name = name[len("DTYPE_"):] if name.startswith("DTYPE_") else name
            try:
                return cls[name]
            except KeyError:
                raise ValueError("unknown dtype %r (f16 or bf16)" % v) from None
        return cls(v)


class ServingStatus(enum.IntEnum):
    """HealthResponse.ServingStatus."""
    UNKNOWN = 0
    SERVING = 1
    DRAINING = 2


@dataclass(frozen=True)
class Geometry:
    """Model geometry of a session: layers, KV heads per layer, head
    dimension, element type, tokens per page (0 = the daemon's default, 8)."""
    layers: int
    kv_heads: int
    head_dim: int
    dtype: DType = DType.F16
    page_tokens: int = 8

    def __post_init__(self) -> None:
        object.__setattr__(self, "dtype", DType.parse(self.dtype))


@dataclass(frozen=True)
class Health:
    """Health answer: serving status, daemon version, uptime, the data-plane
    address of its first thread (opaque; empty when off) and the auth mode
    ("tokens" or "single-tenant")."""
    status: ServingStatus
    version: str
    uptime_ms: int
    dataplane_address: str
    auth_mode: str

    @property
    def serving(self) -> bool:
        """True while the daemon accepts new sessions."""
        return self.status == ServingStatus.SERVING


@dataclass(frozen=True)
class Stats:
    """Stats answer; ``sessions`` and ``clusters`` are the caller's tenant's,
    ``sessions_all`` counts every tenant."""
    pool_bytes_total: int
    pool_bytes_used: int
    disk_bytes_used: int
    sessions: int
    clusters: int
    fetches: int
    cache_hits: int
    cache_misses: int
    bytes_sent: int
    errors: int
    uptime_ms: int
    sessions_all: int


@dataclass(frozen=True)
class Session:
    """A created session: its id, where its worker connects (an opaque
    data-plane address to hand to the worker as is) and the 16-byte secret
    sent in every data-plane header."""
    session_id: int
    dataplane_address: str
    session_secret: bytes = field(repr=False)


@dataclass(frozen=True)
class SessionInfo:
    """One row of ListSessions."""
    session_id: int
    tenant: str
    geometry: Geometry
    label: str
    bytes_in_pool: int
    bytes_on_disk: int
    clusters: int
    created_unix_ms: int
    dataplane_address: str
