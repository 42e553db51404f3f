"""Loading a container from S3-compatible storage on localhost (issue 25).

  meson devenv -C build python tools/bench/bench_s3.py [--mib 1024] [--rounds 5] [-j 8]

A moto[server] S3 (tools/s3/moto-venv.sh: a venv of its own) on 127.0.0.1; one container of
--mib MiB (bf16/f32 transformer-shaped tensors, 4 MiB chunks) uploaded to it. Each round runs,
in a shuffled order, in this process:
- s3:      zckpt.load("s3://bench/model.zckpt"), -j ranged GETs in flight (ZCKPT_S3_CONNECTIONS);
- download+load: one GET of the whole object to a local file, then zckpt.load of that file
  (the page cache holds it warm: the download wrote it);
- local:   zckpt.load of the local file, warm (the ceiling: no network at all).
Every result is compared with the saved tensors. Medians, min and max per contender.
moto is a Python server that copies the whole object for every ranged GET (measured here:
0.4-0.6 s per 4 MiB range of a 256 MiB object, the same as a GET of all of it), so against it
every ranged reader is bounded by the server. --server ranges adds a row against a minimal
threaded HTTP server on localhost that answers HEAD and ranged GETs (with ETag/If-Match) from
the file with os.pread: the client side's own speed over loopback, not an S3 implementation.
Run:ai's streamer is not measured yet (it takes safetensors files and a torch of its own).
"""
import argparse
import os
import random
import statistics
import sys
import tempfile
import time
import http.server
import socketserver
import threading
import urllib.request

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tests", "python"))
import s3_server  # noqa: E402
import zckpt  # noqa: E402


def model(mib):
    g = torch.Generator().manual_seed(0)
    out, total, i = {}, 0, 0
    while total < mib << 20:
        w = torch.randn(2048, 2048, generator=g).to(torch.bfloat16)  # 8 MiB
        out[f"layers.{i}.weight"] = w
        out[f"layers.{i}.norm"] = torch.randn(2048, generator=g)
        total += w.numel() * 2 + 2048 * 4
        i += 1
    return out


class RangeServer:
    """HEAD and ranged GET of one file at /bench/model.zckpt, one thread per connection."""

    def __init__(self, path):
        fd = os.open(path, os.O_RDONLY)
        size = os.fstat(fd).st_size
        etag = '"%x"' % (os.stat(path).st_mtime_ns ^ size)

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def do_HEAD(self):
                self.send_response(200)
                self.send_header("Content-Length", str(size))
                self.send_header("ETag", etag)
                self.end_headers()

            def do_GET(self):
                if self.headers.get("If-Match", etag) != etag:
                    self.send_response(412)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                lo, hi = 0, size - 1
                if "Range" in self.headers:
                    lo, hi = (int(x) for x in self.headers["Range"].split("=")[1].split("-"))
                n = hi - lo + 1
                self.send_response(206 if "Range" in self.headers else 200)
                self.send_header("Content-Length", str(n))
                self.send_header("ETag", etag)
                self.end_headers()
                at = lo
                while at <= hi:
                    b = os.pread(fd, min(8 << 20, hi + 1 - at), at)
                    self.wfile.write(b)
                    at += len(b)

        class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
            daemon_threads = True

        self.server = Server(("127.0.0.1", 0), Handler)
        self.url = "http://127.0.0.1:%d" % self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()


def same(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("-j", "--connections", type=int, default=8, help="parallel ranged GETs (ZCKPT_S3_CONNECTIONS)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--server", default="moto,ranges", help="moto, ranges or both (comma-separated)")
    args = ap.parse_args()

    python, why = s3_server.moto_python()
    if python is None:
        sys.exit("no moto: " + why)
    server = s3_server.MotoServer(python)
    try:
        server.make_bucket("bench")
        os.environ.update(AWS_ENDPOINT_URL=server.url, AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench",
                          AWS_REGION="us-east-1", ZCKPT_S3_CONNECTIONS=str(args.connections))
        tensors = model(args.mib)
        with tempfile.TemporaryDirectory() as d:
            local = os.path.join(d, "model.zckpt")
            zckpt.save(tensors, local)
            size = os.path.getsize(local)
            t0 = time.perf_counter()
            zckpt.save(tensors, "s3://bench/model.zckpt")
            upload = time.perf_counter() - t0
            print(f"container {size / 2**20:.0f} MiB; zckpt.save to s3 (multipart) {upload:.2f} s "
                  f"({size / upload / 2**20:.0f} MiB/s)")
            url = "s3://bench/model.zckpt"
            fetched = os.path.join(d, "fetched.zckpt")

            def s3():
                return zckpt.load(url)

            def download_then_load():
                with urllib.request.urlopen(server.url + "/bench/model.zckpt") as r, open(fetched, "wb") as f:
                    while True:
                        b = r.read(8 << 20)
                        if not b:
                            break
                        f.write(b)
                return zckpt.load(fetched)

            def local_load():
                return zckpt.load(local)

            servers = args.server.split(",")
            ranges = RangeServer(local) if "ranges" in servers else None

            def via_ranges():
                os.environ["AWS_ENDPOINT_URL"] = ranges.url
                try:
                    return zckpt.load(url)
                finally:
                    os.environ["AWS_ENDPOINT_URL"] = server.url

            contenders = {}
            if "moto" in servers:
                contenders["s3 (moto)"] = s3
            if ranges:
                contenders["s3 (range srv)"] = via_ranges
            contenders.update({"download+load": download_then_load, "local (warm)": local_load})
            times = {k: [] for k in contenders}
            rng = random.Random(args.seed)
            for r in range(args.rounds):
                order = list(contenders)
                rng.shuffle(order)
                for name in order:
                    t0 = time.perf_counter()
                    out = contenders[name]()
                    dt = time.perf_counter() - t0
                    assert same(out, tensors), name
                    del out
                    times[name].append(dt)
                print(f"round {r + 1}: " + ", ".join(f"{k} {times[k][-1]:.2f} s" for k in contenders), flush=True)
            print(f"\n{'contender':16} {'median s':>9} {'min':>7} {'max':>7} {'MiB/s':>7}")
            for k, v in times.items():
                med = statistics.median(v)
                print(f"{k:16} {med:9.2f} {min(v):7.2f} {max(v):7.2f} {size / med / 2**20:7.0f}")
    finally:
        server.close()


if __name__ == "__main__":
    main()
