"""Loading a container from S3-compatible storage, and saving one to it (issues 25 and 34), against
Run:ai's model streamer and boto3 on the same server, the same tensors, the same shaping.

  meson devenv -C build python $PWD/tools/bench/bench_s3.py [--mib 1024] [--rounds 5]
      [--server shaped,unshaped,moto] [--ttfb-ms 30] [--conn-mibs 25] [--link-mibs 320] [-j N]

The servers (--server, comma-separated, one table each; default shaped):
- shaped:   the shaping S3 server (tools/s3/shaping_server.py), in a process of its own on
            127.0.0.1, answering as object storage does: --ttfb-ms before each request's first
            byte, each connection held to --conn-mibs MiB/s and all of them together to
            --link-mibs MiB/s (uploads too); by default 30 ms, 25 MiB/s and 320 MiB/s.
- unshaped: the same server with no shaping: the clients' own speed over loopback (what the old
            `ranges` server measured; `ranges` is still accepted for it).
- moto:     moto[server] (tools/s3/moto-venv.sh), which copies the whole object for every ranged
            GET: every ranged reader is bounded by the server there.
One container of --mib MiB (bf16/f32 transformer-shaped tensors, 4 MiB chunks) is served as
s3://bench/model.zckpt and the same tensors as a safetensors file (safetensors.torch.save_file)
as s3://bench/model.safetensors (the shaping server serves both local files in place; moto gets
them uploaded). Each round runs every contender once, in a shuffled order:
- zckpt.load:          zckpt.load("s3://bench/model.zckpt"), in this process;
- zckpt.iter_tensors:  dict(zckpt.iter_tensors("s3://bench/model.zckpt")): each tensor streamed
  into a fresh tensor, one after another (what vLLM's load_format="zckpt" iterates), in this process;
- iter_tensors (dropped): the same stream, each tensor's digest taken and the tensor dropped (its
  time includes the blake2b of every byte): its "+RSS MiB" is what streaming itself holds (the
  read-ahead and the tensor at hand), which must not grow with the object;
- runai streamer:      Run:ai's SafetensorsStreamer (runai-model-streamer and -s3 0.17.1, the
  peers virtualenv of tools/bench/setup-peers.sh) streaming s3://bench/model.safetensors into CPU
  tensors, as `contenders.py runai URL --tensor-digests` in a process of the peers' python, one
  per round, which times the stream_file + get_tensors loop alone (its start-up and imports are
  not in the row). Its environment is every client's (contenders.s3_client_env: path-style
  addressing, no instance metadata, the same keys and region as zckpt's);
- boto3 download+load: boto3's download_file of s3://bench/model.safetensors to a local file
  (its default TransferConfig: 8 MiB parts, 10 threads), then safetensors.torch.load_file of it,
  in this process;
- local (warm):        zckpt.load of the local container, warm: no network at all (a reference);
- zckpt.save:          zckpt.save(tensors, "s3://bench/saved.zckpt") (a multipart upload);
- boto3 upload_file:   upload_file of the local container (the same bytes) to
  s3://bench/uploaded.zckpt (boto3's defaults: 8 MiB parts, 10 threads, CRC32 checksums).
-j N sets every contender's parallelism: ZCKPT_S3_CONNECTIONS, Run:ai's
RUNAI_STREAMER_OBJ_CONCURRENCY (and RUNAI_STREAMER_CONCURRENCY) and boto3's max_concurrency;
without it each runs with its own defaults (zckpt's: a request pool starting at 16 in flight and
growing while throughput grows, to at most 64), as a user would. --only NAME,... runs those rows alone.

The floor (shaped only) is a row of its own, computed, not run: the container's size over the
link, plus one TTFB. "% floor" is each row's floor (its own object's size over the link plus
one TTFB) over its median: 100% is the link full from the first request to the last byte.

Every result is compared with the saved tensors, tensor by tensor (Run:ai's through a digest of
each tensor's name, dtype, shape and bytes, taken in its process after the timing; zckpt.save's
by loading the saved object back with the shaping off, after the timing; upload_file's by the
server's sha256 of the object against the local file's). A contender whose result differs is
reported (WRONG) and the script exits 1; one that cannot run (no peers virtualenv, no boto3,
Run:ai failing) is reported as "NAME: skipped: WHY" and the others still run. Medians [min,
max] over the rounds; never best-of-N. "peak req" is the most requests in flight at the server
during the contender's runs and "conns" the most connections it opened in one run (shaping
server only; boto3's client keeps its pool from round to round, so it opens none after the
first); "+RSS MiB" the most this process's (or Run:ai's process's) resident memory grew over a
run, after what earlier runs freed was given back (malloc_trim): the loaded tensors themselves
are part of it. The machine's load average is printed
before and after each table.
"""
import argparse
import ctypes
import gc
import hashlib
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time

import safetensors.torch
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tests", "python"))
sys.path.insert(0, os.path.join(HERE, "..", "s3"))
sys.path.insert(0, HERE)
import contenders  # noqa: E402
import s3_server  # noqa: E402
import shaping_server  # noqa: E402
import zckpt  # noqa: E402

MiB = 1 << 20


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


def sha256_of(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for b in iter(lambda: f.read(8 << 20), b""):
            h.update(b)
    return h.hexdigest()


def release_free_memory():
    """Gives back to the system what earlier rounds freed, so that a run's RSS growth is its own."""
    gc.collect()
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):
        pass


def loadavg():
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


class Setup:
    """One server with the two objects on it; its contenders."""

    def __init__(self, kind, args, files):
        self.kind, self.args, self.files = kind, args, files
        self.shaping = None
        if kind == "moto":
            python, why = s3_server.moto_python()
            if python is None:
                raise Skipped("no moto: " + why)
            self.server = s3_server.MotoServer(python)
            self.server.make_bucket("bench")
            for key, path in files.items():
                with open(path, "rb") as f:
                    status, _, body = self.server.request("PUT", "/bench/" + key, body=f,
                                                          headers={"Content-Length": str(os.path.getsize(path))})
                assert status == 200, body
        else:
            self.shaping = (shaping_server.Shaping.of(args.ttfb_ms, args.conn_mibs, args.link_mibs)
                            if kind == "shaped" else shaping_server.NONE)
            self.server = shaping_server.ServerProcess(self.shaping)
            self.server.make_bucket("bench")
            for key, path in files.items():
                self.server.serve_file("bench", key, path)
        self.url = self.server.url

    def counts(self):
        return self.kind != "moto"

    def close(self):
        self.server.close()

    def floor(self, nbytes):
        """Seconds of `nbytes` over the link plus one TTFB; None where there is no link."""
        s = self.shaping
        if not s or not s.link_bps:
            return None
        return nbytes / s.link_bps + s.ttfb_s


def boto3_client(url, args):
    import boto3
    import boto3.s3.transfer

    client = boto3.client("s3", endpoint_url=url, aws_access_key_id="bench", aws_secret_access_key="bench",
                          region_name="us-east-1")
    config = boto3.s3.transfer.TransferConfig(**({"max_concurrency": args.connections} if args.connections else {}))
    return client, config


def run_table(setup, args, tensors, local, st_local, d):
    """Runs every contender against `setup` over the rounds; prints the table; True if all right."""
    env = contenders.s3_client_env(setup.url)
    os.environ.clear()
    os.environ.update(env)
    size, st_size = os.path.getsize(local), os.path.getsize(st_local)
    local_sha = sha256_of(local)
    fetched = os.path.join(d, "fetched.safetensors")
    skipped, wrong = {}, {}
    try:
        client, tconfig = boto3_client(setup.url, args)
    except ImportError as e:
        client = None
        skipped["boto3 download+load"] = skipped["boto3 upload_file"] = f"no boto3 ({e}): pip install boto3"
    want_digests = contenders.tensor_digests(tensors)

    def in_process(fn, check):
        def run():
            release_free_memory()
            contenders.reset_peak()
            before = contenders.host_memory()["VmRSS"]
            t0 = time.perf_counter()
            out = fn()
            dt = time.perf_counter() - t0
            rss = contenders.host_memory()["VmHWM"] - before
            return dt, check(out), rss
        return run

    def zckpt_load():
        return zckpt.load("s3://bench/model.zckpt")

    def zckpt_iter():
        return dict(zckpt.iter_tensors("s3://bench/model.zckpt"))

    def zckpt_iter_dropped():
        return {name: contenders.tensor_digests({name: t})[name]
                for name, t in zckpt.iter_tensors("s3://bench/model.zckpt")}

    def boto3_load():
        client.download_file("bench", "model.safetensors", fetched, Config=tconfig)
        return safetensors.torch.load_file(fetched)

    def zckpt_save():
        zckpt.save(tensors, "s3://bench/saved.zckpt")

    def check_saved(_):
        if setup.shaping:
            setup.server.set_shaping(shaping_server.NONE)
        try:
            return differing(zckpt.load("s3://bench/saved.zckpt"), tensors)
        finally:
            if setup.shaping:
                setup.server.set_shaping(setup.shaping)

    def boto3_upload():
        client.upload_file(local, "bench", "uploaded.zckpt", Config=tconfig)

    def check_uploaded(_):
        if not setup.counts():
            status, body = setup.server.get("bench", "uploaded.zckpt")
            return [] if status == 200 and hashlib.sha256(body).hexdigest() == local_sha else ["the uploaded object"]
        got = setup.server.digest("bench", "uploaded.zckpt")
        return [] if got["sha256"] == local_sha else [f"the uploaded object (sha256 {got['sha256'][:12]}...)"]

    def runai():
        env = dict(os.environ)
        if args.connections:
            env.update(RUNAI_STREAMER_OBJ_CONCURRENCY=str(args.connections),
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
        return out["seconds"], differing_digests(out["digests"], want_digests), out["rss_peak"] - out["rss_before"]

    same = lambda out: differing(out, tensors)  # noqa: E731
    # name -> (run() -> (seconds, names differing, RSS growth), bytes moved, a load or a save)
    rows = {
        "zckpt.load": (in_process(zckpt_load, same), size, "load"),
        "zckpt.iter_tensors": (in_process(zckpt_iter, same), size, "load"),
        "iter_tensors (dropped)": (in_process(zckpt_iter_dropped, lambda got: differing_digests(got, want_digests)),
                                  size, "load"),
        "runai streamer": (runai, st_size, "load"),
        "boto3 download+load": (in_process(boto3_load, same), st_size, "load"),
        "local (warm)": (in_process(lambda: zckpt.load(local), same), size, "local"),
        "zckpt.save": (in_process(zckpt_save, check_saved), size, "save"),
        "boto3 upload_file": (in_process(boto3_upload, check_uploaded), size, "save"),
    }
    if args.only:
        unknown = set(args.only) - set(rows)
        if unknown:
            raise SystemExit(f"--only: no row {', '.join(sorted(unknown))} (rows: {', '.join(rows)})")
        rows = {k: v for k, v in rows.items() if k in args.only}
    why = runai_unavailable(args.peers_python) if "runai streamer" in rows else None
    if why:
        skipped["runai streamer"] = why
    times = {k: [] for k in rows}
    peaks, conns, rss = {k: 0 for k in rows}, {k: 0 for k in rows}, {k: 0 for k in rows}
    rng = random.Random(args.seed)
    print(f"\n== {setup.kind}: {setup.shaping.describe() if setup.shaping else 'moto'} "
          f"(load average {loadavg()})", flush=True)
    for r in range(args.rounds):
        order = [k for k in rows if k not in skipped and k not in wrong]
        rng.shuffle(order)
        for name in order:
            run = rows[name][0]
            if setup.counts():
                setup.server.reset_stats()
            try:
                dt, bad, grew = run()
            except Skipped as e:
                skipped[name] = f"round {r + 1}: {e}"
                print(f"{name}: skipped: {skipped[name]}", flush=True)
                continue
            if setup.counts() and rows[name][2] != "local":
                st = setup.server.stats()
                peaks[name] = max(peaks[name], st["peak_in_flight"])
                conns[name] = max(conns[name], st["connections"])
            rss[name] = max(rss[name], grew)
            if bad:
                wrong[name] = bad
                print(f"{name}: WRONG in round {r + 1}: {', '.join(bad[:5])}{' ...' if len(bad) > 5 else ''} "
                      f"({len(bad)} of {len(tensors)})", flush=True)
                continue
            times[name].append(dt)
        print(f"round {r + 1}: " + ", ".join(f"{k} {times[k][-1]:.2f} s" for k in order
                                             if k not in skipped and k not in wrong and times[k]), flush=True)

    head = f"{'contender':22} {'median s':>9} {'min':>7} {'max':>7} {'MiB/s':>7} {'% floor':>8} {'peak req':>9} {'conns':>6} {'+RSS MiB':>9}"
    print(f"\n[{setup.kind}] {setup.shaping.describe() if setup.shaping else 'moto'}; {size / MiB:.0f} MiB container, "
          f"{st_size / MiB:.0f} MiB safetensors; {args.rounds} rounds, shuffled; "
          f"{'-j ' + str(args.connections) if args.connections else 'each with its own defaults'}")
    print(head)
    floor = setup.floor(size)
    if floor:
        print(f"{'floor (size/link+TTFB)':22} {floor:9.2f} {'-':>7} {'-':>7} {size / floor / MiB:7.0f} {'100%':>8} "
              f"{'-':>9} {'-':>6} {'-':>9}")
    for kind in ("load", "local", "save"):
        for k, (_, nbytes, what) in rows.items():
            if what != kind:
                continue
            if k in wrong:
                print(f"{k:22} WRONG: {', '.join(wrong[k][:5])}")
                continue
            if k in skipped or not times[k]:
                continue
            v = times[k]
            med = statistics.median(v)
            f = setup.floor(nbytes)
            pct = f"{100 * f / med:.0f}%" if f and what != "local" else "-"
            counted = setup.counts() and what != "local"
            print(f"{k:22} {med:9.2f} {min(v):7.2f} {max(v):7.2f} {nbytes / med / MiB:7.0f} {pct:>8} "
                  f"{peaks[k] if counted else '-':>9} {conns[k] if counted else '-':>6} {rss[k] / MiB:9.0f}")
    for k, why in skipped.items():
        print(f"{k}: skipped: {why}")
    print(f"(load average after: {loadavg()}; peak req: requests in flight at the server, conns: connections "
          f"opened in one run, '-' where not measured)", flush=True)
    return not wrong


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mib", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("-j", "--connections", type=int, default=0,
                    help="every contender's parallelism (ZCKPT_S3_CONNECTIONS, Run:ai's concurrency, boto3's "
                         "max_concurrency); 0 (the default): each its own default")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--server", default="shaped", help="shaped, unshaped (or ranges), moto; comma-separated")
    ap.add_argument("--ttfb-ms", type=float, default=30, help="shaped: time to first byte of every request")
    ap.add_argument("--conn-mibs", type=float, default=25, help="shaped: MiB/s each connection")
    ap.add_argument("--link-mibs", type=float, default=320, help="shaped: MiB/s all connections together")
    ap.add_argument("--peers-python", default=os.path.expanduser("~/.cache/zckpt/peers-venv/bin/python"),
                    help="the python of the peers virtualenv (tools/bench/setup-peers.sh), for Run:ai's rows")
    ap.add_argument("--only", type=lambda v: [x.strip() for x in v.split(",") if x.strip()], default=None,
                    help="comma-separated row names to run (default: every row)")
    args = ap.parse_args()
    kinds = ["unshaped" if k == "ranges" else k for k in args.server.split(",")]
    if any(k not in ("shaped", "unshaped", "moto") for k in kinds):
        ap.error(f"--server {args.server}: expected shaped, unshaped, ranges or moto")

    if args.connections:
        os.environ["ZCKPT_S3_CONNECTIONS"] = str(args.connections)
    tensors = model(args.mib)
    ok = True
    with tempfile.TemporaryDirectory() as d:
        local = os.path.join(d, "model.zckpt")
        zckpt.save(tensors, local)
        st_local = os.path.join(d, "model.safetensors")
        safetensors.torch.save_file(tensors, st_local)
        print(f"{len(tensors)} tensors; container {os.path.getsize(local) / MiB:.0f} MiB, safetensors "
              f"{os.path.getsize(st_local) / MiB:.0f} MiB; {os.cpu_count()} CPUs", flush=True)
        for kind in kinds:
            try:
                setup = Setup(kind, args, {"model.zckpt": local, "model.safetensors": st_local})
            except Skipped as e:
                print(f"[{kind}] skipped: {e}")
                continue
            try:
                ok &= run_table(setup, args, tensors, local, st_local, d)
            finally:
                setup.close()
    if not ok:
        sys.exit(1)


if __name__ == "__main__":
    main()
