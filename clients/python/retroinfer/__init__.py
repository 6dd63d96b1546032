"""retroinfer: Python client of the ri-kvstore control API.

See docs/python-client.md in the repository.  The names exported here are
the whole public API: :class:`Client`, the value types and the errors.
"""
from retroinfer.client import DEFAULT_ADDRESS, DEFAULT_TIMEOUT, Client
from retroinfer.errors import (Aborted, AlreadyExists, Cancelled, DataLoss, DeadlineExceeded, FailedPrecondition,
                               Internal, InvalidArgument, NotFound, OutOfRange, PermissionDenied,
                               ResourceExhausted, RetroInferError, Unauthenticated, Unavailable, Unimplemented,
                               Unknown)
from retroinfer.types import DType, Geometry, Health, ServingStatus, Session, SessionInfo, Stats

__version__ = "0.1.0"

__all__ = [
    "Client", "DEFAULT_ADDRESS", "DEFAULT_TIMEOUT",
    "DType", "Geometry", "Health", "ServingStatus", "Session", "SessionInfo", "Stats",
    "RetroInferError", "Aborted", "AlreadyExists", "Cancelled", "DataLoss", "DeadlineExceeded",
    "FailedPrecondition", "Internal", "InvalidArgument", "NotFound", "OutOfRange", "PermissionDenied",
    "ResourceExhausted", "Unauthenticated", "Unavailable", "Unimplemented", "Unknown",
]
