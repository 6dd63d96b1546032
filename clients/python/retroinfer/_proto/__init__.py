"""Generated gRPC stubs of proto/retroinfer.proto (made by setup.py at build
time, never committed).  Import them from here to get a clear message when
the package runs from a source tree that was never built."""
try:
    from retroinfer._proto import retroinfer_pb2 as pb
    from retroinfer._proto import retroinfer_pb2_grpc as pb_grpc
except ImportError as e:  # pragma: no cover - only in an unbuilt source tree
    raise ImportError(
        "retroinfer: the gRPC stubs are missing (%s); they are generated when the package is "
        "built: pip install ./clients/python (from the repository root)" % e) from e

__all__ = ["pb", "pb_grpc"]
