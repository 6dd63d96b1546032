"""Helpers the Python benches share (bench/*/NAME.py): the processes they
start (ri-kvstore, ri-worker on loopback, each announcing its ports in a
port file) and the report fields every bench carries (docs/bench-format.md:
the commit, the machine and its load)."""
import os
import platform
import signal
import subprocess
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def wait_port_file(proc, path, what, seconds=120):
    """The KEY=VALUE pairs of a port file once proc has written it; exits
    when proc dies first or nothing comes within seconds."""
    end = time.time() + seconds
    while time.time() < end:
        if os.path.exists(path):
            keys = dict(l.split("=", 1) for l in open(path).read().split() if "=" in l)
            if keys:
                return keys
        if proc.poll() is not None:
            raise SystemExit("%s exited %d at start" % (what, proc.returncode))
        time.sleep(0.05)
    raise SystemExit("%s wrote no port file in %d s" % (what, seconds))


def start_kvstore(build, tmp, memory):
    """ri-kvstore on loopback (single tenant, its log in tmp); (process, ports)."""
    ports = os.path.join(tmp, "kvs.ports")
    os.environ.setdefault("UCX_TLS", "posix,sysv,cma,tcp,self")  # same host: shared memory
    p = subprocess.Popen([os.path.join(build, "bin", "ri-kvstore"), "--listen=127.0.0.1:0",
                          "--dataplane-listen=127.0.0.1:0", "--metrics-listen=127.0.0.1:0", "--insecure-admin",
                          "--memory=" + memory, "--no-hugepages", "--drain-timeout-ms=3000", "--port-file=" + ports],
                         stdout=open(os.path.join(tmp, "kvstore.log"), "wb"), stderr=subprocess.STDOUT)
    return p, wait_port_file(p, ports, "ri-kvstore", 180)


def stop(p):
    """SIGTERM, then SIGKILL after 30 s; None or an ended process is a no-op."""
    if p is None or p.poll() is not None:
        return
    p.send_signal(signal.SIGTERM)
    try:
        p.wait(30)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()


def build_source(build):
    """The source tree a CMake build folder was configured from (its
    CMakeCache.txt), or None: a folder of copied binaries names none."""
    try:
        with open(os.path.join(build, "CMakeCache.txt")) as f:
            for line in f:
                if line.startswith("CMAKE_HOME_DIRECTORY:"):
                    return line.split("=", 1)[1].strip()
    except OSError:
        pass
    return None


def git_sha(build=None):
    """The commit of the binaries under test: that of the tree the build
    folder was configured from; for a folder of copied binaries, the first
    word of its COMMIT file (written when they were copied); else this
    checkout's ("-dirty" with uncommitted changes to tracked files)."""
    src = build_source(build) if build else None
    if build and src is None:
        try:
            with open(os.path.join(build, "COMMIT")) as f:
                words = f.read().split()
            if words:
                return words[0]
        except OSError:
            pass
    src = src or ROOT
    try:
        sha = subprocess.run(["git", "-C", src, "rev-parse", "HEAD"], capture_output=True, text=True,
                             timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", src, "status", "--porcelain", "-uno"], capture_output=True, text=True,
                               timeout=10).stdout.strip()
        return sha + ("-dirty" if dirty else "") if sha else "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def machine():
    """The report's machine block: CPU model, cores, load average now."""
    cpu = platform.processor() or "unknown"
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "load_avg": os.getloadavg()[0]}
