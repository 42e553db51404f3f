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
moto is a Python server: its own speed (single GETs of MiBs through werkzeug) bounds every
remote figure here.
Run:ai's streamer is not measured yet (it takes safetensors files and a torch of its own).
"""
import argparse
import os
import random
import statistics
import sys
import tempfile
import time
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


def same(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("-j", "--connections", type=int, default=8, help="parallel ranged GETs (ZCKPT_S3_CONNECTIONS)")
    ap.add_argument("--seed", type=int, default=0)
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

            contenders = {"s3": s3, "download+load": download_then_load, "local (warm)": local_load}
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
