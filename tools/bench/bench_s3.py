"""Loading a container from S3-compatible storage on localhost (issue 25), against Run:ai's
model streamer reading the same tensors from the same server.

  meson devenv -C build python $PWD/tools/bench/bench_s3.py [--mib 1024] [--rounds 5] [-j 8] [--server moto,ranges]

A moto[server] S3 (tools/s3/moto-venv.sh: a venv of its own) on 127.0.0.1; one container of
--mib MiB (bf16/f32 transformer-shaped tensors, 4 MiB chunks) uploaded to it as
s3://bench/model.zckpt, and the same tensors as a safetensors file (safetensors.torch.save_file)
as s3://bench/model.safetensors. Each round runs every contender once, in a shuffled order:
- s3:      zckpt.load("s3://bench/model.zckpt"), -j ranged GETs in flight (ZCKPT_S3_CONNECTIONS);
- download+load: one GET of the whole object to a local file, then zckpt.load of that file
  (the page cache holds it warm: the download wrote it);
- local:   zckpt.load of the local file, warm (the ceiling: no network at all; the "x local"
  column is each contender's median over this one's);
- runai s3: Run:ai's SafetensorsStreamer (runai-model-streamer and runai-model-streamer-s3
  0.17.1, in the peers virtualenv of tools/bench/setup-peers.sh) streaming
  s3://bench/model.safetensors into CPU tensors. It needs that virtualenv, so it runs as
  `contenders.py runai URL --tensor-digests` in a process of the peers' python, one per round,
  which times the stream_file + get_tensors loop alone: this row excludes its process start-up
  and imports (the zckpt rows run in this process, zckpt imported once before). Its
  environment: AWS_ENDPOINT_URL (the server), RUNAI_STREAMER_S3_USE_VIRTUAL_ADDRESSING=0
  (path-style requests), AWS_EC2_METADATA_DISABLED=true, the same AWS_ACCESS_KEY_ID,
  AWS_SECRET_ACCESS_KEY and AWS_REGION as zckpt's (read by the AWS SDK's default chain:
  RUNAI_STREAMER_NO_BOTO3_SESSION defaults to 1 in 0.17.1), and, for fairness,
  RUNAI_STREAMER_OBJ_CONCURRENCY = -j (and RUNAI_STREAMER_CONCURRENCY, the variable 0.17 falls
  back to, the same): -j S3 clients against zckpt's -j connections.
Every result is compared tensor by tensor with the saved tensors (Run:ai's through a digest of
each tensor's name, dtype, shape and bytes, taken in its process after the timing); a contender
whose tensors differ is reported and the script exits 1. A contender that cannot run (no peers
virtualenv, Run:ai failing) is reported as "NAME: skipped: WHY" and the others still run.
Medians, min and max per contender; never best-of-N.

moto is a Python server that copies the whole object for every ranged GET (measured here:
0.4-0.6 s per 4 MiB range of a 256 MiB object, the same as a GET of all of it), so against it
every ranged reader is bounded by the server. --server ranges adds rows against a minimal
threaded HTTP server on localhost that answers HEAD and ranged GETs (with ETag/If-Match and
Content-Range) of the two objects with os.pread: the client side's own speed over loopback, not
an S3 implementation. Run:ai reads from it too ("runai s3 (range srv)"): for one file its CRT
client asks for nothing but ranged GETs (no HEAD, no listing, no If-Match), in the absolute form
(GET http://HOST/bench/KEY), and reads the size from Content-Range. That server counts the GETs
in flight: the GETs column is each contender's peak there, the fairness measured, not assumed
(each of Run:ai's CRT clients may open more than one connection).
"""
import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
import http.server
import socketserver
import threading
import urllib.parse
import urllib.request

import safetensors.torch
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tests", "python"))
sys.path.insert(0, HERE)
import contenders  # noqa: E402
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
    """HEAD and ranged GET of a few files (URL path -> file), one thread per connection; counts
    the GETs in flight (peak, since reset_peak)."""

    def __init__(self, files):
        opened = {}
        for url_path, path in files.items():
            fd = os.open(path, os.O_RDONLY)
            size = os.fstat(fd).st_size
            opened[url_path] = (fd, size, '"%x"' % (os.stat(path).st_mtime_ns ^ size))
        self.fds = [fd for fd, _, _ in opened.values()]
        self.lock = threading.Lock()
        self.inflight = self.peak = 0
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            # The headers and the body go out in separate writes: with Nagle's algorithm on, each
            # response's body waited for the client's delayed ACK of its headers (~40 ms a GET).
            disable_nagle_algorithm = True

            def log_message(self, *a):
                pass

            def _file(self):
                # AWS's CRT client sends the absolute form (GET http://HOST/bucket/key).
                got = opened.get(urllib.parse.urlsplit(self.path).path)
                if got is None:
                    self.send_response(404)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                return got

            def do_HEAD(self):
                got = self._file()
                if got:
                    self.send_response(200)
                    self.send_header("Content-Length", str(got[1]))
                    self.send_header("ETag", got[2])
                    self.end_headers()

            def do_GET(self):
                with server.lock:
                    server.inflight += 1
                    server.peak = max(server.peak, server.inflight)
                try:
                    self._get()
                finally:
                    with server.lock:
                        server.inflight -= 1

            def _get(self):
                got = self._file()
                if not got:
                    return
                fd, size, etag = got
                if self.headers.get("If-Match", etag) != etag:
                    self.send_response(412)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                lo, hi = 0, size - 1
                if "Range" in self.headers:
                    a, b = self.headers["Range"].split("=")[1].split("-")
                    lo, hi = int(a), min(int(b), size - 1) if b else size - 1
                n = hi - lo + 1
                self.send_response(206 if "Range" in self.headers else 200)
                self.send_header("Content-Length", str(n))
                if "Range" in self.headers:
                    self.send_header("Content-Range", f"bytes {lo}-{hi}/{size}")
                self.send_header("ETag", etag)
                self.end_headers()
                at = lo
                while at <= hi:
                    b = os.pread(fd, min(8 << 20, hi + 1 - at), at)
                    self.wfile.write(b)
                    at += len(b)

        class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
            daemon_threads = True
            # socketserver's default backlog of 5: a client opening -j connections at once had
            # the SYNs past it dropped, and retransmitted a second later.
            request_queue_size = 128

        self.server = Server(("127.0.0.1", 0), Handler)
        self.url = "http://127.0.0.1:%d" % self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def reset_peak(self):
        with self.lock:
            self.peak = 0

    def close(self):
        self.server.shutdown()
        for fd in self.fds:
            os.close(fd)


def differing(got, want):
    """Names whose tensors differ from `want` (missing, extra, other dtype, shape or bytes)."""
    bad = sorted(set(got) ^ set(want))
    return bad + [k for k in want if k in got and not (got[k].dtype == want[k].dtype and torch.equal(got[k], want[k]))]


def differing_digests(got, want):
    """The same, from contenders.tensor_digests of both sides."""
    return sorted(k for k in set(got) | set(want) if got.get(k) != want.get(k))


class Skipped(Exception):
    """A contender that cannot run here; the message says why."""


def last_lines(text, n=3):
    return " | ".join(line.strip() for line in text.strip().splitlines()[-n:]) or "(nothing on stderr)"


def runai_unavailable(python):
    """Why Run:ai's S3 streamer cannot run with `python`, or None."""
    if not os.path.exists(python):
        return f"no peers Python at {python} (tools/bench/setup-peers.sh makes it)"
    r = subprocess.run([python, "-c", "import runai_model_streamer, runai_model_streamer_s3"],
                       capture_output=True, text=True)
    if r.returncode:
        return f"runai_model_streamer_s3 not importable by {python}: {last_lines(r.stderr, 1)}"
    return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("-j", "--connections", type=int, default=8,
                    help="parallel ranged GETs (ZCKPT_S3_CONNECTIONS); Run:ai's RUNAI_STREAMER_OBJ_CONCURRENCY")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--server", default="moto,ranges", help="moto, ranges or both (comma-separated)")
    ap.add_argument("--peers-python", default=os.path.expanduser("~/.cache/zckpt/peers-venv/bin/python"),
                    help="the python of the peers virtualenv (tools/bench/setup-peers.sh), for Run:ai's rows")
    args = ap.parse_args()
    servers = args.server.split(",")

    python, why = s3_server.moto_python()
    if python is None:
        sys.exit("no moto: " + why)
    server = s3_server.MotoServer(python)
    ranges = None
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
            st_local = os.path.join(d, "model.safetensors")
            safetensors.torch.save_file(tensors, st_local)
            st_size = os.path.getsize(st_local)
            with open(st_local, "rb") as f:
                status, _, body = server.request("PUT", "/bench/model.safetensors", body=f,
                                                 headers={"Content-Length": str(st_size)})
            assert status == 200, body
            print(f"safetensors {st_size / 2**20:.0f} MiB (for Run:ai), uploaded as s3://bench/model.safetensors")
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

            if "ranges" in servers:
                ranges = RangeServer({"/bench/model.zckpt": local, "/bench/model.safetensors": st_local})

            def via_ranges():
                os.environ["AWS_ENDPOINT_URL"] = ranges.url
                try:
                    return zckpt.load(url)
                finally:
                    os.environ["AWS_ENDPOINT_URL"] = server.url

            want_digests = None

            def runai(endpoint):
                """Run:ai's streamer in a process of the peers' python: (seconds of the load, names differing)."""
                env = dict(os.environ, AWS_ENDPOINT_URL=endpoint, RUNAI_STREAMER_S3_USE_VIRTUAL_ADDRESSING="0",
                           AWS_EC2_METADATA_DISABLED="true", RUNAI_STREAMER_OBJ_CONCURRENCY=str(args.connections),
                           RUNAI_STREAMER_CONCURRENCY=str(args.connections))
                try:
                    r = subprocess.run([args.peers_python, os.path.join(HERE, "contenders.py"), "runai",
                                        "s3://bench/model.safetensors", "--tensor-digests"],
                                       env=env, capture_output=True, text=True, timeout=600 + args.mib)
                except subprocess.TimeoutExpired as e:
                    raise Skipped(f"no result in {e.timeout} s") from None
                if r.returncode:
                    raise Skipped(f"exit {r.returncode}: {last_lines(r.stderr)}")
                out = json.loads(r.stdout.strip().splitlines()[-1])
                return out["seconds"], differing_digests(out["digests"], want_digests)

            contenders_ = {}  # name -> (run() -> (seconds, names differing), bytes read, RangeServer or None)

            def in_process(fn):
                def run():
                    t0 = time.perf_counter()
                    out = fn()
                    dt = time.perf_counter() - t0
                    return dt, differing(out, tensors)
                return run

            if "moto" in servers:
                contenders_["s3 (moto)"] = (in_process(s3), size, None)
            if ranges:
                contenders_["s3 (range srv)"] = (in_process(via_ranges), size, ranges)
            contenders_["download+load"] = (in_process(download_then_load), size, None)
            contenders_["local (warm)"] = (in_process(local_load), size, None)
            skipped = {}
            runai_rows = {}
            if "moto" in servers:
                runai_rows["runai s3 (moto)"] = (lambda: runai(server.url), st_size, None)
            if ranges:
                runai_rows["runai s3 (range srv)"] = (lambda: runai(ranges.url), st_size, ranges)
            why = runai_unavailable(args.peers_python)
            if why:
                skipped.update((k, why) for k in runai_rows)
            else:
                want_digests = contenders.tensor_digests(tensors)
                contenders_.update(runai_rows)

            times = {k: [] for k in contenders_}
            peaks = {k: 0 for k in contenders_}
            wrong = {}
            rng = random.Random(args.seed)
            for r in range(args.rounds):
                order = [k for k in contenders_ if k not in skipped and k not in wrong]
                rng.shuffle(order)
                for name in order:
                    run, _, srv = contenders_[name]
                    if srv:
                        srv.reset_peak()
                    try:
                        dt, bad = run()
                    except Skipped as e:
                        skipped[name] = f"round {r + 1}: {e}"
                        print(f"{name}: skipped: {skipped[name]}", flush=True)
                        continue
                    if srv:
                        peaks[name] = max(peaks[name], srv.peak)
                    if bad:
                        wrong[name] = bad
                        print(f"{name}: WRONG TENSORS in round {r + 1}: {', '.join(bad[:5])}"
                              f"{' ...' if len(bad) > 5 else ''} ({len(bad)} of {len(tensors)})", flush=True)
                        continue
                    times[name].append(dt)
                print(f"round {r + 1}: " + ", ".join(f"{k} {times[k][-1]:.2f} s" for k in order
                                                     if k not in skipped and k not in wrong), flush=True)

            ceiling = statistics.median(times["local (warm)"])
            print(f"\n{'contender':22} {'median s':>9} {'min':>7} {'max':>7} {'MiB/s':>7} {'x local':>8} {'GETs':>5}")
            for k, (_, nbytes, srv) in contenders_.items():
                if k in wrong:
                    print(f"{k:22} WRONG TENSORS: {', '.join(wrong[k][:5])}")
                    continue
                if k in skipped or not times[k]:
                    continue
                v = times[k]
                med = statistics.median(v)
                gets = str(peaks[k]) if srv else "-"
                print(f"{k:22} {med:9.2f} {min(v):7.2f} {max(v):7.2f} {nbytes / med / 2**20:7.0f} "
                      f"{med / ceiling:7.2f}x {gets:>5}")
            for k, why in skipped.items():
                print(f"{k}: skipped: {why}")
            print(f"({args.rounds} rounds in a shuffled order; -j {args.connections}; GETs: the peak number of "
                  "GETs in flight at the range server, '-' where not measured)")
            if wrong:
                sys.exit(1)
    finally:
        if ranges:
            ranges.close()
        server.close()


if __name__ == "__main__":
    main()
