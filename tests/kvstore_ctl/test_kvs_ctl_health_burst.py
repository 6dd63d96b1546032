#!/usr/bin/env python3
"""A burst of Health calls must not leave the daemon larger for good.

Starts the real ri-kvstore on loopback, measures its RSS at rest, sends
32 connections x 64 parallel Health calls x 5 rounds with ~60 KiB requests
(an unknown field, which Health accepts), waits 3 s and measures again; then
a second, larger burst (64 connections).  After the bursts the daemon may
keep at most 10 MiB over its rest size, and ri_kvs_grpc_heap_trims_total
shows it gave memory back.  Against the daemon before the heap trim: rest
25 MiB, 41 MiB after the bursts (+16 MiB, kept for good), so the check
failed.  Skips (77) without the grpcio package.
"""
import os, re, subprocess, sys, tempfile, threading, time, urllib.request

try:
    import grpc
except ImportError:
    print("skip: no grpcio")
    sys.exit(77)

build = os.environ.get("RI_BUILD_DIR", "build")
binary = os.path.join(build, "bin", "ri-kvstore")
if not os.access(binary, os.X_OK):
    print("skip: %s not built" % binary)
    sys.exit(77)

PAYLOAD = bytes([0x7A, 0x80, 0xE0, 0x03]) + b"x" * (60 * 1024)  # field 15, 61440 bytes


def rss_mib(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    return -1.0


def burst(addr, conns, per_conn, rounds):
    errors = [0]

    def client():
        ch = grpc.insecure_channel(addr)
        call = ch.unary_unary("/retroinfer.v1.KvStore/Health")
        for _ in range(rounds):
            futs = [call.future(PAYLOAD, timeout=30) for _ in range(per_conn)]
            for f in futs:
                try:
                    f.result()
                except grpc.RpcError:
                    errors[0] += 1
        ch.close()

    ts = [threading.Thread(target=client) for _ in range(conns)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return errors[0]


def main():
    d = tempfile.mkdtemp(prefix="ri-health-")
    ports = os.path.join(d, "ports")
    log = open(os.path.join(d, "kvstore.log"), "w")
    p = subprocess.Popen([binary, "--listen=127.0.0.1:0", "--dataplane-listen=127.0.0.1:0",
                          "--metrics-listen=127.0.0.1:0", "--memory=64MiB", "--no-hugepages",
                          "--port-file=" + ports], stdout=log, stderr=subprocess.STDOUT)
    try:
        for _ in range(150):
            if os.path.exists(ports) and os.path.getsize(ports) > 0:
                break
            time.sleep(0.1)
        kv = dict(l.strip().split("=", 1) for l in open(ports) if "=" in l)
        addr, metrics = kv["grpc"], kv["metrics"]
        time.sleep(1)
        rest = rss_mib(p.pid)
        e1 = burst(addr, 32, 64, 5)
        time.sleep(3)
        after1 = rss_mib(p.pid)
        e2 = burst(addr, 64, 64, 5)
        time.sleep(3)
        after2 = rss_mib(p.pid)
        page = urllib.request.urlopen("http://%s/metrics" % metrics, timeout=10).read().decode()
        m = re.search(r"^ri_kvs_grpc_heap_trims_total (\d+)$", page, re.M)
        trims = int(m.group(1)) if m else -1
        print("RSS MiB: rest %.1f, after burst 1 %.1f, after burst 2 %.1f; heap trims %d; call errors %d"
              % (rest, after1, after2, trims, e1 + e2))
        ok = p.poll() is None and after2 - rest <= 10.0 and trims >= 1
        return 0 if ok else 1
    finally:
        p.terminate()
        p.wait(timeout=15)
        log.close()
        subprocess.call(["rm", "-rf", d])


if __name__ == "__main__":
    sys.exit(main())
