"""retroinfer-ctl (or python -m retroinfer): a small command line over the
Python client, printing JSON.  The C CLI (./ri status, stats, sessions,
drain) does the same for operators; this one is for Python installs and
shows the client in use.

Exit status: 0 on success, 1 when the call failed (the typed error is
printed on stderr), 2 for bad arguments.
"""
import argparse
import dataclasses
import enum
import json
import os
import sys
from typing import List, Optional

from retroinfer.client import DEFAULT_ADDRESS, DEFAULT_TIMEOUT, Client
from retroinfer.errors import RetroInferError
from retroinfer.types import Geometry


def _jsonable(v):
    if dataclasses.is_dataclass(v):
        return {k: _jsonable(x) for k, x in dataclasses.asdict(v).items()}
    if isinstance(v, enum.Enum):
        return v.name
    if isinstance(v, bytes):
        return v.hex()
    if isinstance(v, dict):
        return {k: _jsonable(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_jsonable(x) for x in v]
    return v


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="retroinfer-ctl", description="Call the ri-kvstore control API.")
    env = os.environ.get
    p.add_argument("--addr", default=env("RI_CTL_ADDR", DEFAULT_ADDRESS), help="daemon host:port")
    p.add_argument("--token", default=env("RI_CTL_TOKEN"), help="bearer token (or $RI_CTL_TOKEN)")
    p.add_argument("--token-file", help="read the bearer token from this file")
    p.add_argument("--tls", action="store_true", help="TLS with the system's trusted roots")
    p.add_argument("--tls-ca", default=env("RI_CTL_TLS_CA"), help="PEM CA bundle of the daemon's certificate")
    p.add_argument("--tls-cert", default=env("RI_CTL_TLS_CERT"), help="PEM client certificate (mutual TLS)")
    p.add_argument("--tls-key", default=env("RI_CTL_TLS_KEY"), help="PEM client key (mutual TLS)")
    p.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT, help="seconds per call")
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("health", help="liveness, version, auth mode")
    sub.add_parser("stats", help="pool, session and cache counters")
    sub.add_parser("sessions", help="list the tenant's sessions")
    c = sub.add_parser("create", help="create a session")
    c.add_argument("--layers", type=int, required=True)
    c.add_argument("--kv-heads", type=int, required=True)
    c.add_argument("--head-dim", type=int, required=True)
    c.add_argument("--dtype", default="f16", help="f16 or bf16")
    c.add_argument("--page-tokens", type=int, default=8)
    c.add_argument("--tokens", type=int, required=True, help="expected context length")
    c.add_argument("--label", default="")
    d = sub.add_parser("drop", help="drop a session")
    d.add_argument("session_id", type=int)
    sub.add_parser("drain", help="stop new sessions (admin token)")
    return p


def main(argv: Optional[List[str]] = None) -> int:
    a = _parser().parse_args(argv)
    try:
        with Client(a.addr, token=a.token if a.token_file is None else None, token_file=a.token_file,
                    tls=a.tls, ca_file=a.tls_ca, cert_file=a.tls_cert, key_file=a.tls_key,
                    timeout=a.timeout) as kv:
            if a.cmd == "health":
                out = kv.health()
            elif a.cmd == "stats":
                out = kv.stats()
            elif a.cmd == "sessions":
                out = kv.list_sessions()
            elif a.cmd == "create":
                g = Geometry(a.layers, a.kv_heads, a.head_dim, a.dtype, a.page_tokens)
                out = kv.create_session(g, a.tokens, a.label)
            elif a.cmd == "drop":
                out = {"bytes_freed": kv.drop_session(a.session_id)}
            else:
                out = {"sessions_open": kv.drain()}
    except RetroInferError as e:  # before ValueError: InvalidArgument is one
        print("retroinfer-ctl: %s" % e, file=sys.stderr)
        return 1
    except ValueError as e:  # bad options (unreadable file, cert without key)
        print("retroinfer-ctl: %s" % e, file=sys.stderr)
        return 2
    print(json.dumps(_jsonable(out)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
