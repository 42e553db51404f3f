#!/usr/bin/env python3
"""vLLM benchmark: engine start-up and weight load with `--load-format zckpt` against vLLM's
default safetensors loader (and fastsafetensors, runai_streamer, instanttensor, tensorizer when
their packages are installed in the vLLM virtualenv, ZCKPT_VLLM_PEERS=1 tools/setup-vllm.sh; each
is reported as skipped otherwise, and as failed, with vLLM's error, when it does not run here), and
weight reload (reload_weights through collective_rpc) from a zckpt folder against a reload from
the safetensors folder.

Run with the vLLM virtualenv's Python (tools/setup-vllm.sh prints it):

  $(bash tools/setup-vllm.sh | tail -1) tools/bench/bench_vllm.py [--gib 1] [--rounds 3]
                                        [--workdir DIR] [--out results.json]
                                        [--s3 shaped|unshaped [--ttfb-ms 30] [--conn-mibs 25] [--link-mibs 320]]

Writes a random Llama of about --gib GiB (float32; under 0.25 GiB a narrower one) with
transformers (safetensors shards) into WORKDIR/<gib>gib/, and a second one (the update), converts
both with `zckpt convert`, then over --rounds rounds in a rotating order starts one engine per
load format in a process of its own (skip_tokenizer_init, the "uni" executor,
VLLM_ENABLE_V1_MULTIPROCESSING=0) and reports medians of:

  contenders the default loader (safetensors, mapped), zckpt (mapped, every chunk checked in the
             mapping), zckpt with mmap=False (streamed into fresh tensors), the peers installed
  start      LLM(...) construction, wall seconds
  load       the load format's load_weights (read + vLLM's weight_loader copies)
  reload     collective_rpc("reload_weights", weights_path=UPDATE), the update's format the same as
             the engine's (zckpt: every chunk verified and the tensor table checked first)
  verify     of zckpt's reload, the part that checks the update before the first tensor
             (zckpt.iter_tensors(UPDATE, verify_first=True) returning), in this process

Every engine's greedy output after start-up must equal the default loader's (else the run stops).
The files stay in the page cache (read once before the rounds).

--s3 shaped|unshaped: start-up from object storage instead (issue 34), zckpt against vLLM's
runai_streamer, both reading s3:// from the shaping S3 server (tools/s3/shaping_server.py, a
process of its own on 127.0.0.1; shaped: --ttfb-ms before each request's first byte, --conn-mibs
each connection, --link-mibs all of them together, by default bench_s3.py's S3-like 30 ms, 25
MiB/s, 320 MiB/s; unshaped: loopback speed). The same random Llama (--gib) is served in place as
s3://bench/a-hf/ (the safetensors folder) and s3://bench/a-zckpt/ (its conversion); each round
starts one engine each, in a rotating order, as a user would:

  zckpt           LLM(model="s3://bench/a-zckpt", load_format="zckpt")
  runai_streamer  LLM(model="s3://bench/a-hf", load_format="runai_streamer") (runai-model-streamer
                  with its S3 package: ZCKPT_VLLM_PEERS=1 tools/setup-vllm.sh; skipped without)

vLLM pulls each model's config files (with Run:ai's pull_files, which zckpt's plugin keeps
off the containers; the same for both) into a fresh VLLM_ASSETS_CACHE every start, then the load format streams the weights. The engines' environment
is bench_s3.py's for Run:ai: AWS_ENDPOINT_URL, fixed keys and region, path-style addressing
(RUNAI_STREAMER_S3_USE_VIRTUAL_ADDRESSING=0), AWS_EC2_METADATA_DISABLED. Reported, medians over
--rounds: start (LLM(...) construction, pulls included) and load (load_weights) seconds; from
the server's counters, the most requests in flight and connections opened, the HEAD, GET and
LIST requests of one start (and, in the per-round lines, those of its load_weights alone), the
bytes served; the engine process's peak RSS (ru_maxrss); and, shaped, the floor (the safetensors
bytes over the link plus one TTFB). The greedy output of every engine must equal that of the
default loader started once from the local safetensors folder. Not timed: the reload. E.g.

  $PY tools/bench/bench_vllm.py --s3 shaped --gib 2 --rounds 3
"""
import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import time

PROMPT = [1, 5, 9, 33, 70, 11, 12]
PEERS = {"fastsafetensors": "fastsafetensors", "runai_streamer": "runai_model_streamer",
         "instanttensor": "instanttensor", "tensorizer": "tensorizer"}


def make(folder, gib, seed):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    # Under 0.25 GiB (a check that things run, not a measure) a narrower Llama: the 1024-wide one's
    # embeddings alone are 0.25 GiB.
    hidden, inter, vocab = (1024, 2816, 32000) if gib >= 0.25 else (256, 704, 4096)
    per_layer = 4 * hidden * hidden + 3 * hidden * inter + 2 * hidden
    layers = max(1, int((gib * (1 << 30) / 4 - 2 * vocab * hidden) // per_layer))
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers,
                         num_attention_heads=hidden // 64, num_key_value_heads=hidden // 64, head_dim=64,
                         max_position_embeddings=512,
                         tie_word_embeddings=False, bos_token_id=1, eos_token_id=2)
    with torch.device("cpu"):
        model = LlamaForCausalLM(config).float()
    model.save_pretrained(folder, safe_serialization=True, max_shard_size="500MB")


def server_stats():
    """The shaping server's counters (--s3: its URL in ZCKPT_BENCH_S3_STATS), or None."""
    url = os.environ.get("ZCKPT_BENCH_S3_STATS")
    if not url:
        return None
    import urllib.request

    with urllib.request.urlopen(url + "/_shaping/stats", timeout=60) as r:
        return json.loads(r.read())


def engine_child(fmt, folder, update, extra="{}"):
    import resource

    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from vllm import LLM, SamplingParams
    from vllm.model_executor import model_loader
    from vllm.plugins import load_general_plugins

    load_general_plugins()
    cls = model_loader._LOAD_FORMAT_TO_MODEL_LOADER[fmt]
    timed = {}
    original = cls.load_weights

    def load_weights(self, model, model_config):
        before = server_stats()
        t0 = time.perf_counter()
        original(self, model, model_config)
        timed["load"] = time.perf_counter() - t0
        if before is not None:  # the requests of the load alone (the rest: vLLM's pulls of the config files)
            after = server_stats()["requests"]
            timed["load_requests"] = {k: n - before["requests"].get(k, 0) for k, n in after.items()
                                      if n != before["requests"].get(k, 0)}

    cls.load_weights = load_weights
    t0 = time.perf_counter()
    llm = LLM(model=folder, load_format=fmt, skip_tokenizer_init=True, dtype="float32", max_model_len=128,
              distributed_executor_backend="uni", enforce_eager=True, seed=0,
              model_loader_extra_config=json.loads(extra))
    start = time.perf_counter() - t0
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True, detokenize=False)
    tokens = list(llm.generate([{"prompt_token_ids": PROMPT}], params, use_tqdm=False)[0].outputs[0].token_ids)
    out = {"start": start, "load": timed.get("load"), "tokens": tokens, "load_requests": timed.get("load_requests"),
           "rss_peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
    if update:
        t0 = time.perf_counter()
        llm.collective_rpc("reload_weights", kwargs={"weights_path": update})
        out["reload"] = time.perf_counter() - t0
        out["tokens_after"] = list(llm.generate([{"prompt_token_ids": PROMPT}], params,
                                                use_tqdm=False)[0].outputs[0].token_ids)
    print("RESULT " + json.dumps(out))


def run_child(*args, fatal=True, env=None):
    r = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", *args], capture_output=True, text=True,
                       env=env)
    lines = [x for x in r.stdout.splitlines() if x.startswith("RESULT ")]
    if r.returncode != 0 or not lines:
        errors = [x for x in (r.stdout + r.stderr).splitlines() if "Error" in x and not x.startswith(" ")]
        why = f"exit {r.returncode}: " + (errors[-1].strip()[:300] if errors else r.stderr.strip()[-300:])
        if fatal:
            raise SystemExit(f"{args}: {why}\n{r.stdout[-2000:]}\n{r.stderr[-4000:]}")
        return {"error": why}
    return json.loads(lines[-1][7:])


def read_all(folder):
    for name in sorted(os.listdir(folder)):
        with open(os.path.join(folder, name), "rb") as f:
            while f.read(64 << 20):
                pass


S3_CONTENDERS = {"zckpt": "a-zckpt", "runai_streamer": "a-hf"}  # load format -> the folder it reads
S3_PACKAGES = {"runai_streamer": ("runai_model_streamer", "runai_model_streamer_s3")}
OPS = (("HEAD", "HeadObject"), ("GET", "GetObject"), ("LIST", "ListObjectsV2"))


def folder_bytes(folder):
    return sum(os.path.getsize(os.path.join(r, f)) for r, _, files in os.walk(folder) for f in files)


def s3_env(url, cache):
    """The engines' environment for --s3: the benchmarks' S3 client settings (contenders.py), vLLM's
    pulled config files in `cache`."""
    from contenders import s3_client_env

    return dict(s3_client_env(url), VLLM_ASSETS_CACHE=cache, ZCKPT_BENCH_S3_STATS=url)


def s3_main(a, folder, size):
    """--s3: engine start-up from s3://bench/ on the shaping server, zckpt against runai_streamer."""
    import shutil
    import tempfile

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "s3"))
    import shaping_server

    hf, conv = folder
    shaping = shaping_server.Shaping.of(a.ttfb_ms, a.conn_mibs, a.link_mibs) if a.s3 == "shaped" else shaping_server.NONE
    ref = run_child("engine", "auto", hf, "", "{}")  # the default loader, local: the output to match
    contenders, skipped, failed = [], {}, {}
    for fmt in S3_CONTENDERS:
        missing = [m for m in S3_PACKAGES.get(fmt, ()) if importlib.util.find_spec(m) is None]
        if missing:
            skipped[fmt] = f"python package {missing[0]!r} not installed in {sys.prefix}"
        else:
            contenders.append(fmt)
    server = shaping_server.ServerProcess(shaping)
    results = {f: [] for f in contenders}
    try:
        server.make_bucket("bench")
        for local in (hf, conv):
            for root, _, files in os.walk(local):
                for f in files:
                    path = os.path.join(root, f)
                    key = os.path.relpath(path, os.path.dirname(local)).replace(os.sep, "/")
                    server.serve_file("bench", key, path)
        print(f"[{a.s3}] {shaping.describe()}; {server.url}", flush=True)
        for r in range(a.rounds):
            order = contenders[r % len(contenders):] + contenders[:r % len(contenders)]
            for fmt in order:
                if fmt in failed:
                    continue
                cache = tempfile.mkdtemp(prefix="vllm-assets-")  # config files pulled afresh each start
                server.reset_stats()
                try:
                    res = run_child("engine", fmt, f"s3://bench/{S3_CONTENDERS[fmt]}", "", "{}",
                                    fatal=fmt == "zckpt", env=s3_env(server.url, cache))
                finally:
                    shutil.rmtree(cache, ignore_errors=True)
                if "error" in res:
                    failed[fmt] = res["error"]
                    print(f"round {r} {fmt}: failed: {res['error']}", flush=True)
                    continue
                res["server"] = server.stats()
                if res["tokens"] != ref["tokens"]:
                    raise SystemExit(f"{fmt}: outputs differ from the default loader's (local): {res['tokens']} "
                                     f"vs {ref['tokens']}")
                results[fmt].append(res)
                req = res["server"]["requests"]
                print(f"round {r} {fmt}: start {res['start']:.2f} s, load {res['load']:.2f} s, requests {req}, "
                      f"of the load {res['load_requests']}", flush=True)
    finally:
        server.close()
    import vllm

    conv_size = folder_bytes(conv)
    summary = {"mode": f"s3 {a.s3}", "shaping": shaping.describe(), "safetensors_bytes": size, "zckpt_bytes": conv_size,
               "rounds": a.rounds, "vllm": vllm.__version__, "cpus": os.cpu_count(), "skipped": skipped,
               "failed": failed, "tokens_match_default_loader": True, "formats": {}}
    floor = size / shaping.link_bps + shaping.ttfb_s if shaping.link_bps else None
    print(f"\nstart-up from s3:// ({a.s3}: {shaping.describe()}); model {size / (1 << 30):.2f} GiB float32 "
          f"safetensors, {conv_size / (1 << 30):.2f} GiB zckpt; vLLM {vllm.__version__}, {os.cpu_count()} CPUs, "
          f"medians of {a.rounds} rounds; greedy output equal to the default loader's (local)")
    print(f"{'format':<16}{'start s':>9}{'load s':>8}{'MiB/s':>7}{'peak req':>9}{'conns':>6}{'HEAD':>6}{'GET':>6}"
          f"{'LIST':>6}{'MiB out':>9}{'RSS MiB':>9}")
    for fmt, rs in results.items():
        if not rs:
            continue
        med = {k: statistics.median(x[k] for x in rs) for k in ("start", "load", "rss_peak_mib")}
        last = rs[-1]["server"]
        ops = {name: last["requests"].get(op, 0) for name, op in OPS}
        med.update(peak_in_flight=max(x["server"]["peak_in_flight"] for x in rs),
                   connections=max(x["server"]["connections"] for x in rs), requests=last["requests"],
                   load_requests=rs[-1]["load_requests"], bytes_out=last["bytes_out"])
        summary["formats"][fmt] = med
        nbytes = conv_size if fmt == "zckpt" else size
        print(f"{fmt:<16}{med['start']:9.2f}{med['load']:8.2f}{nbytes / med['load'] / (1 << 20):7.0f}"
              f"{med['peak_in_flight']:9d}{med['connections']:6d}{ops['HEAD']:6d}{ops['GET']:6d}{ops['LIST']:6d}"
              f"{last['bytes_out'] / (1 << 20):9.0f}{med['rss_peak_mib']:9.0f}")
    if floor:
        print(f"{'floor':<16}{'-':>9}{floor:8.2f}  (the safetensors bytes over the link, plus one TTFB)")
    for fmt, why in skipped.items():
        print(f"{fmt:<16}skipped: {why}")
    for fmt, why in failed.items():
        print(f"{fmt:<16}failed: {why}")
    print("peak req: most requests in flight at the server; conns: connections opened; HEAD/GET/LIST: requests "
          "of one start (the last round's; vLLM's pulls of the config files included); MiB out: bytes served; "
          "RSS MiB: the engine process's peak resident memory")
    if a.out:
        with open(a.out, "w") as f:
            json.dump(summary, f, indent=1)


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        kind, *rest = sys.argv[2:]
        if kind == "make":
            make(rest[0], float(rest[1]), int(rest[2]))
            print("RESULT {}")
        else:
            engine_child(*rest)
        return
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--gib", type=float, default=1.0)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--workdir", default="/tmp/zckpt-bench-vllm")
    p.add_argument("--zckpt", default="zckpt", help="the zckpt command (default: the one on PATH / in this venv)")
    p.add_argument("--out")
    p.add_argument("--s3", choices=("shaped", "unshaped"),
                   help="start-up from s3:// on the shaping server: zckpt against runai_streamer (see above)")
    p.add_argument("--ttfb-ms", type=float, default=30, help="--s3 shaped: time to first byte of every request")
    p.add_argument("--conn-mibs", type=float, default=25, help="--s3 shaped: MiB/s each connection")
    p.add_argument("--link-mibs", type=float, default=320, help="--s3 shaped: MiB/s all connections together")
    a = p.parse_args()
    workdir = os.path.join(a.workdir, f"{a.gib:g}gib")  # a model per size
    os.makedirs(workdir, exist_ok=True)
    zckpt_cmd = a.zckpt
    if zckpt_cmd == "zckpt" and os.path.exists(os.path.join(os.path.dirname(sys.executable), "zckpt")):
        zckpt_cmd = os.path.join(os.path.dirname(sys.executable), "zckpt")
    folders = {}
    for name, seed in (("a", 0),) if a.s3 else (("a", 0), ("b", 1)):
        hf, conv = os.path.join(workdir, f"{name}-hf"), os.path.join(workdir, f"{name}-zckpt")
        if not os.path.exists(os.path.join(hf, "config.json")):
            run_child("make", hf, str(a.gib), str(seed))
        if not os.path.exists(os.path.join(conv, "config.json")):
            subprocess.run([zckpt_cmd, "convert", hf, "-o", conv + "/"], check=True, capture_output=True)
        folders[name] = (hf, conv)
        read_all(hf)
        read_all(conv)
    size = sum(os.path.getsize(os.path.join(folders["a"][0], f)) for f in os.listdir(folders["a"][0]))
    if a.s3:
        return s3_main(a, folders["a"], size)
    # label -> (load format, model_loader_extra_config)
    contenders = {"auto": ("auto", {}), "zckpt": ("zckpt", {}), "zckpt mmap=False": ("zckpt", {"mmap": False})}
    skipped = {}
    for fmt, module in PEERS.items():
        if importlib.util.find_spec(module) is None:
            skipped[fmt] = f"python package {module!r} not installed in {sys.prefix}"
        else:
            contenders[fmt] = (fmt, {})
    formats = list(contenders)
    results = {f: [] for f in formats}
    verify_s = []
    failed = {}
    for r in range(a.rounds):
        import zckpt

        t0 = time.perf_counter()
        zckpt.iter_tensors(folders["b"][1], verify_first=True)
        verify_s.append(time.perf_counter() - t0)
        order = formats[r % len(formats):] + formats[:r % len(formats)]
        for fmt in order:
            load_format, extra = contenders[fmt]
            which = 1 if load_format == "zckpt" else 0
            if fmt in failed:
                continue
            res = run_child("engine", load_format, folders["a"][which], folders["b"][which], json.dumps(extra),
                            fatal=fmt in ("auto", "zckpt"))
            if "error" in res:  # a peer that does not run on this build: said once, left out
                failed[fmt] = res["error"]
                print(f"round {r} {fmt}: failed: {res['error']}", flush=True)
                continue
            results[fmt].append(res)
            print(f"round {r} {fmt}: start {res['start']:.2f} s, load {res['load'] or float('nan'):.2f} s, "
                  f"reload {res['reload']:.2f} s", flush=True)
    ref = results["auto"][0]
    results = {f: rs for f, rs in results.items() if f not in failed}
    for fmt, rs in results.items():
        for res in rs:
            if res["tokens"] != ref["tokens"] or res["tokens_after"] != ref["tokens_after"]:
                raise SystemExit(f"{fmt}: outputs differ from the default loader's: {res} vs {ref}")
    import torch
    import vllm

    summary = {"model_bytes": size, "rounds": a.rounds, "vllm": vllm.__version__, "torch": torch.__version__,
               "cpus": os.cpu_count(), "skipped": skipped, "failed": failed, "formats": {}}
    print(f"\nmodel {size / (1 << 30):.2f} GiB float32, vLLM {vllm.__version__}, torch {torch.__version__}, "
          f"{os.cpu_count()} CPUs, medians of {a.rounds} rounds")
    print(f"{'format':<18}{'start s':>9}{'load s':>9}{'reload s':>10}{'load GB/s':>11}")
    for fmt, rs in results.items():
        med = {}
        for k in ("start", "load", "reload"):
            values = [x[k] for x in rs if x.get(k) is not None]
            med[k] = statistics.median(values) if values else float("nan")
        summary["formats"][fmt] = med
        print(f"{fmt:<18}{med['start']:9.2f}{med['load']:9.2f}{med['reload']:10.2f}{size / med['load'] / 1e9:11.2f}")
    for fmt, why in skipped.items():
        print(f"{fmt:<18}skipped: {why}")
    for fmt, why in failed.items():
        print(f"{fmt:<18}failed: {why}")
    summary["zckpt_reload_verify"] = statistics.median(verify_s)
    print(f"of zckpt's reload, verifying the update first: {summary['zckpt_reload_verify']:.2f} s "
          f"({size / summary['zckpt_reload_verify'] / 1e9:.2f} GB/s)")
    if a.out:
        with open(a.out, "w") as f:
            json.dump(summary, f, indent=1)


if __name__ == "__main__":
    main()
