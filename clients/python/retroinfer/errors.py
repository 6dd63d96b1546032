"""Typed errors of the retroinfer client.

Every failed call raises a subclass of :class:`RetroInferError`, chosen by
the gRPC status code (the daemon's codes and their meaning are in
docs/kvstore.md, "The control API").  Where a built-in exception means the
same thing the class derives from it too, so ``except TimeoutError`` and
``except ValueError`` work as expected.
"""
from typing import Dict, Optional, Type

import grpc

__all__ = [
    "RetroInferError", "Cancelled", "Unknown", "InvalidArgument", "DeadlineExceeded", "NotFound",
    "AlreadyExists", "PermissionDenied", "ResourceExhausted", "FailedPrecondition", "Aborted",
    "OutOfRange", "Unimplemented", "Internal", "Unavailable", "DataLoss", "Unauthenticated",
    "error_for_code", "from_rpc_error",
]


class RetroInferError(Exception):
    """A control-API call failed.

    Attributes: ``code`` (:class:`grpc.StatusCode`), ``details`` (the
    server's or gRPC's message), ``method`` (e.g. ``"CreateSession"``) and
    ``address`` (the daemon's), the last two None when unknown.
    """

    code: grpc.StatusCode = grpc.StatusCode.UNKNOWN

    def __init__(self, details: str = "", *, code: Optional[grpc.StatusCode] = None,
                 method: Optional[str] = None, address: Optional[str] = None) -> None:
        if code is not None:
            self.code = code
        self.details = details
        self.method = method
        self.address = address
        where = "%s at %s" % (method, address) if method and address else (method or address or "")
        text = "%s: %s" % (self.code.name, details) if details else self.code.name
        super().__init__("%s: %s" % (where, text) if where else text)


class Cancelled(RetroInferError):
    """The call was cancelled (e.g. the daemon shut down while it ran)."""
    code = grpc.StatusCode.CANCELLED


class Unknown(RetroInferError):
    """An error gRPC could not classify."""
    code = grpc.StatusCode.UNKNOWN


class InvalidArgument(RetroInferError, ValueError):
    """A request field is out of range; ``details`` names the field."""
    code = grpc.StatusCode.INVALID_ARGUMENT


class DeadlineExceeded(RetroInferError, TimeoutError):
    """No answer within the call's timeout."""
    code = grpc.StatusCode.DEADLINE_EXCEEDED


class NotFound(RetroInferError, LookupError):
    """No such session for the caller's tenant (another tenant's looks the same)."""
    code = grpc.StatusCode.NOT_FOUND


class AlreadyExists(RetroInferError):
    code = grpc.StatusCode.ALREADY_EXISTS


class PermissionDenied(RetroInferError):
    """The token is valid but may not do this (Drain needs an admin token)."""
    code = grpc.StatusCode.PERMISSION_DENIED


class ResourceExhausted(RetroInferError):
    """Over the tenant's or the global memory quota, too many sessions, or a
    request larger than the daemon's max-message."""
    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class FailedPrecondition(RetroInferError):
    """The daemon is draining: no new sessions."""
    code = grpc.StatusCode.FAILED_PRECONDITION


class Aborted(RetroInferError):
    code = grpc.StatusCode.ABORTED


class OutOfRange(RetroInferError):
    code = grpc.StatusCode.OUT_OF_RANGE


class Unimplemented(RetroInferError):
    """The daemon does not know the method (an older daemon)."""
    code = grpc.StatusCode.UNIMPLEMENTED


class Internal(RetroInferError):
    code = grpc.StatusCode.INTERNAL


class Unavailable(RetroInferError, ConnectionError):
    """No daemon at the address, it is shutting down, or the TLS handshake
    failed (wrong CA, missing client certificate, TLS against plaintext)."""
    code = grpc.StatusCode.UNAVAILABLE


class DataLoss(RetroInferError):
    code = grpc.StatusCode.DATA_LOSS


class Unauthenticated(RetroInferError):
    """Missing or unknown bearer token."""
    code = grpc.StatusCode.UNAUTHENTICATED


_BY_CODE: Dict[grpc.StatusCode, Type[RetroInferError]] = {
    cls.code: cls for cls in (Cancelled, Unknown, InvalidArgument, DeadlineExceeded, NotFound, AlreadyExists,
                              PermissionDenied, ResourceExhausted, FailedPrecondition, Aborted, OutOfRange,
                              Unimplemented, Internal, Unavailable, DataLoss, Unauthenticated)
}


def error_for_code(code: grpc.StatusCode) -> Type[RetroInferError]:
    """The exception class for a gRPC status code (RetroInferError for OK or
    a code gRPC adds later)."""
    return _BY_CODE.get(code, RetroInferError)


def from_rpc_error(e: grpc.RpcError, method: Optional[str] = None,
                   address: Optional[str] = None) -> RetroInferError:
    """Convert a grpc.RpcError raised by a stub into the typed error."""
    code = e.code() if hasattr(e, "code") else grpc.StatusCode.UNKNOWN
    details = (e.details() if hasattr(e, "details") else str(e)) or ""
    return error_for_code(code)(details, code=code, method=method, address=address)
