"""Build of the retroinfer Python client: generates the gRPC stubs.

The stubs (retroinfer/_proto/retroinfer_pb2*.py and .pyi) are generated from
the repository's proto/retroinfer.proto with grpcio-tools each time the
package is built, so they always match the daemon's API and are never
committed.  The proto is looked up, in order, at $RI_PROTO, at
../../proto/retroinfer.proto (a repository checkout) and at
retroinfer/_proto/retroinfer.proto (an sdist, which carries a copy); it is
copied into the package as well.  Everything else is in pyproject.toml.
"""
import os
import shutil
import tempfile
from importlib import metadata

from setuptools import setup
from setuptools.command.build_py import build_py as _build_py
from setuptools.command.sdist import sdist as _sdist

HERE = os.path.dirname(os.path.abspath(__file__))
PROTO_REL = os.path.join("retroinfer", "_proto", "retroinfer.proto")


def find_proto() -> str:
    """Path of retroinfer.proto, or a RuntimeError naming where it looked."""
    candidates = [
        os.environ.get("RI_PROTO", ""),
        os.path.join(HERE, "..", "..", "proto", "retroinfer.proto"),
        os.path.join(HERE, PROTO_REL),
    ]
    for c in candidates:
        if c and os.path.isfile(c):
            return os.path.abspath(c)
    raise RuntimeError("retroinfer.proto not found (looked at $RI_PROTO, %s); build from a "
                       "repository checkout or set RI_PROTO" % ", ".join(c for c in candidates[1:]))


def generate_stubs(out_dir: str) -> None:
    """Run protoc (from grpcio-tools) on the proto, writing the package's
    retroinfer/_proto/ modules under out_dir."""
    from grpc_tools import protoc  # build requirement (pyproject.toml)

    proto = find_proto()
    with tempfile.TemporaryDirectory() as tmp:
        # protoc names the generated imports after the proto's path below its
        # include root: placed at retroinfer/_proto/ the _grpc module imports
        # "from retroinfer._proto import retroinfer_pb2", inside the package.
        staged = os.path.join(tmp, PROTO_REL)
        os.makedirs(os.path.dirname(staged))
        shutil.copyfile(proto, staged)
        well_known = os.path.join(os.path.dirname(protoc.__file__), "_proto")
        args = ["grpc_tools.protoc", "-I" + tmp, "-I" + well_known, "--python_out=" + out_dir,
                "--pyi_out=" + out_dir, "--grpc_python_out=" + out_dir, PROTO_REL]
        if protoc.main(args) != 0:
            raise RuntimeError("protoc failed on %s" % proto)
        dest = os.path.join(out_dir, PROTO_REL)
        if os.path.abspath(dest) != os.path.abspath(proto):
            shutil.copyfile(proto, dest)


class build_py(_build_py):
    """build_py that also generates the stubs (into the source tree for an
    editable install, which imports from there)."""

    def run(self):
        super().run()
        generate_stubs(HERE if getattr(self, "editable_mode", False) else self.build_lib)


class sdist(_sdist):
    """sdist that carries a copy of the proto, so it builds outside the repository."""

    def make_release_tree(self, base_dir, files):
        super().make_release_tree(base_dir, files)
        dest = os.path.join(base_dir, PROTO_REL)
        if os.path.exists(dest):
            os.unlink(dest)  # may be a hard link to the source
        shutil.copyfile(find_proto(), dest)


def runtime_requirements() -> list:
    """grpcio and protobuf at least as new as the grpcio-tools and protobuf
    that generated the stubs (the generated code checks both at import)."""
    reqs = ["grpcio", "protobuf"]
    try:
        reqs = ["grpcio>=" + metadata.version("grpcio-tools"), "protobuf>=" + metadata.version("protobuf")]
    except metadata.PackageNotFoundError:
        pass  # metadata only (no grpcio-tools yet): building will need it
    return reqs


setup(cmdclass={"build_py": build_py, "sdist": sdist}, install_requires=runtime_requirements())
