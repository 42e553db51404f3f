"""The contenders of tools/bench/bench.py: one load per process, timed from inside.

`python contenders.py KIND FILE [--cache warm|fadvise|drop] [--digest] [--tensor-digests]` imports what KIND needs,
puts FILE's pages where --cache says (after the imports, so a cold run does not also time the
loading of torch's own libraries), then times the load alone and prints one JSON line:

  seconds      wall time of the load (and, for lazily mapped results, of reading every byte)
  cpu_seconds  user + system time of all the process's threads over the same span
  rss_before, rss_peak   VmRSS before, VmHWM after (peak reset first where the kernel allows)
  resident_before        fraction of FILE's pages in the page cache just before the load
                         (mincore): 1.0 warm, 0.0 cold -- the harness checks it
  digest       with --digest: a digest of every tensor's name, dtype, shape and bytes, taken
               after the timing, to check that every contender returned the same tensors
  digests      with --tensor-digests: {name: digest} of each tensor alone, to say which differ

FILE may be an object-store URL (s3://BUCKET/KEY) for a contender that reads one (runai, as
tools/bench/bench_s3.py runs it): there is no page cache to prepare (--cache warm only) and
resident_before is null.

Contenders that return tensors aliasing a file mapping (safetensors on CPU, torch.load
mmap=True, zckpt.load mmap=True) read every byte inside the timing (READ_EVERY_BYTE): a
mapping that nothing reads costs nothing, and a caller is going to read the weights.

Cold caches: `fadvise` evicts FILE's clean pages with posix_fadvise(DONTNEED) (only FILE: the
libraries already mapped stay cached, as on a serving host), `drop` writes 3 to
/proc/sys/vm/drop_caches (root only; drops every clean page of the machine). Either way the
fraction left resident is measured and reported.
"""
import argparse
import ctypes
import ctypes.util
import hashlib
import json
import mmap
import os
import resource
import sys
import time

MADV_POPULATE_WRITE = 23  # Linux 5.14


# ---------------------------------------------------------------- page cache


def resident_fraction(path):
    """Fraction of `path`'s pages in the page cache (mincore over a mapping never touched)."""
    size = os.path.getsize(path)
    if size == 0:
        return 1.0
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if addr in (None, ctypes.c_void_p(-1).value):
            raise OSError(ctypes.get_errno(), "mmap failed")
        try:
            pages = (size + mmap.PAGESIZE - 1) // mmap.PAGESIZE
            vec = ctypes.create_string_buffer(pages)
            if libc.mincore(ctypes.c_void_p(addr), size, vec) != 0:
                raise OSError(ctypes.get_errno(), "mincore failed")
            return sum(b & 1 for b in vec.raw) / pages
        finally:
            libc.munmap(ctypes.c_void_p(addr), size)
    finally:
        os.close(fd)


def evict(path, how):
    """Drops `path`'s pages from the page cache: 'fadvise' (this file) or 'drop' (all files)."""
    if how == "fadvise":
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    elif how == "drop":
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
    else:
        raise ValueError(how)


def warm(path):
    """Reads `path` whole so every page is cached."""
    with open(path, "rb", buffering=0) as f:
        buf = bytearray(16 << 20)
        while f.readinto(buf):
            pass


def prepare_cache(path, how):
    if how == "warm":
        warm(path)
    else:
        evict(path, how)
    return resident_fraction(path)


# ---------------------------------------------------------------- measuring


# What a caller's environment may hold that would point a client somewhere other than the bench
# server, or change how zckpt addresses it.
_S3_ENV_DROPPED = ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL_S3", "ZCKPT_S3_ADDRESSING")


def s3_client_env(url, base=None):
    """The environment every S3 client of the benchmarks (zckpt, Run:ai's streamer, boto3) reads to
    reach the bench server at `url`: its keys and region, path-style addressing for Run:ai, no
    instance-metadata lookups, nothing of _S3_ENV_DROPPED. `base`: the environment to start from
    (default os.environ)."""
    env = dict(os.environ if base is None else base, AWS_ENDPOINT_URL=url, AWS_ACCESS_KEY_ID="bench",
               AWS_SECRET_ACCESS_KEY="bench", AWS_REGION="us-east-1",
               RUNAI_STREAMER_S3_USE_VIRTUAL_ADDRESSING="0", AWS_EC2_METADATA_DISABLED="true")
    for k in _S3_ENV_DROPPED:
        env.pop(k, None)
    return env


def host_memory():
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            if k in ("VmRSS", "VmHWM"):
                out[k] = int(v.split()[0]) * 1024
    return out


def cpu_seconds():
    u = resource.getrusage(resource.RUSAGE_SELF)  # every thread of the process
    return u.ru_utime + u.ru_stime


def reset_peak():
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def tensors_of(result):
    """(name, tensor) pairs of a loaded result: a dict of tensors (possibly nested) or a list."""
    import torch

    if isinstance(result, torch.Tensor):
        yield "", result
    elif isinstance(result, dict) or hasattr(result, "items"):
        for k, v in result.items():
            for n, t in tensors_of(v):
                yield (f"{k}.{n}" if n else str(k)), t
    elif isinstance(result, (list, tuple)):
        for i, v in enumerate(result):
            for n, t in tensors_of(v):
                yield (f"{i}.{n}" if n else str(i)), t


def read_every_byte(result):
    """Reads every byte of every tensor (a sum over 8-byte words, plus any tail)."""
    import torch

    total = 0
    for _, t in tensors_of(result):
        b = t.reshape(-1).view(torch.uint8)
        n = b.numel() // 8 * 8
        if n:
            total += int(b[:n].view(torch.int64).sum())
        if n < b.numel():
            total += int(b[n:].sum())
    return total


def _hash_tensor(h, name, t):
    import torch

    t = t.detach().to("cpu").contiguous()
    h.update(f"{name}|{str(t.dtype).removeprefix('torch.')}|{tuple(t.shape)}|".encode())
    if t.numel():
        h.update(memoryview(t.reshape(-1).view(torch.uint8).numpy()))


def digest(result):
    """blake2b over the sorted (name, dtype, shape, bytes) of every tensor."""
    h = hashlib.blake2b(digest_size=16)
    for name, t in sorted(tensors_of(result), key=lambda p: p[0]):
        _hash_tensor(h, name, t)
    return h.hexdigest()


def tensor_digests(result):
    """{name: blake2b of (name, dtype, shape, bytes)}, one per tensor, to say which ones differ."""
    out = {}
    for name, t in tensors_of(result):
        h = hashlib.blake2b(digest_size=16)
        _hash_tensor(h, name, t)
        out[name] = h.hexdigest()
    return out


# ---------------------------------------------------------------- the contenders


def load_zckpt_py(path):
    import zckpt

    return zckpt.load(path, map_location="cpu")


def load_zckpt_py_noverify(path):
    import zckpt

    return zckpt.load(path, map_location="cpu", verify=False)


def load_zckpt_mmap(path):
    import zckpt

    sd = zckpt.load(path, mmap=True)
    read_every_byte(sd)
    return sd


def load_torch(path):
    import torch

    return torch.load(path, map_location="cpu", weights_only=True)


def load_torch_mmap(path):
    import torch

    sd = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    read_every_byte(sd)
    return sd


def load_safetensors(path):
    from safetensors.torch import load_file

    sd = load_file(path, device="cpu")
    read_every_byte(sd)
    return sd


def load_tensorizer(path):
    from tensorizer import TensorDeserializer

    d = TensorDeserializer(path, device="cpu")
    sd = dict(d.items())
    d.close()
    return sd


def load_tensorizer_verified(path):
    from tensorizer import TensorDeserializer

    d = TensorDeserializer(path, device="cpu", verify_hash=True)
    sd = dict(d.items())
    d.close()
    return sd


def load_fastsafetensors(path):
    from fastsafetensors import SafeTensorsFileLoader

    loader = SafeTensorsFileLoader(None, "cpu", nogds=True)
    loader.add_filenames({0: [path]})
    fb = loader.copy_files_to_device()
    # The tensors alias the loader's buffer, freed by close(): keep the buffer and loader alive
    # with the result, as a caller that keeps the weights would.
    return _Keep({k: fb.get_tensor(k) for k in loader.get_keys()}, (fb, loader))


def load_runai(path):
    from runai_model_streamer import SafetensorsStreamer

    sd = {}
    with SafetensorsStreamer() as s:
        s.stream_file(path)  # owned=True: every yielded tensor stays valid
        for name, t in s.get_tensors():
            sd[name] = t
    return sd


class _Keep(dict):
    """A dict of tensors that also holds whatever owns their memory."""

    def __init__(self, d, owners):
        super().__init__(d)
        self.owners = owners


# Floors: the same bytes moved with nothing but the tricks zckpt uses (parallel preads straight
# into the destination, MADV_POPULATE_WRITE before), and without them.


def _fresh(nbytes, populate):
    m = mmap.mmap(-1, max(nbytes, 1), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if populate:
        try:
            m.madvise(MADV_POPULATE_WRITE)
        except OSError:
            pass  # kernel < 5.14: pages fault in as written
    return m


def _in_pieces(size, threads, move):
    """move(begin, end) over [0, size) in 8 MiB pieces shared out to `threads` threads, each
    taking the next piece as it finishes one; the first error is raised."""
    import threading

    piece = 8 << 20
    next_off = [0]
    lock = threading.Lock()
    errors = []

    def work():
        try:
            while True:
                with lock:
                    off = next_off[0]
                    next_off[0] += piece
                if off >= size:
                    return
                move(off, min(off + piece, size))
        except BaseException as e:  # noqa: BLE001 - reported by the caller
            errors.append(e)

    ts = [threading.Thread(target=work) for _ in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    if errors:
        raise errors[0]


def _pread_parallel(path, buf, threads):
    fd = os.open(path, os.O_RDONLY)
    mv = memoryview(buf)

    def move(off, end):
        while off < end:
            n = os.preadv(fd, [mv[off:end]], off)
            if n <= 0:
                raise OSError("short read")
            off += n

    try:
        _in_pieces(os.path.getsize(path), threads, move)
    finally:
        os.close(fd)
    return buf


def load_floor_read_1t(path):
    """read(2) of the file into fresh memory, one thread, no populate (the naive floor)."""
    return _pread_parallel(path, _fresh(os.path.getsize(path), False), 1)


def load_floor_pread_tricks(path):
    """pread into fresh memory populated first, from as many threads as zckpt's default readers."""
    return _pread_parallel(path, _fresh(os.path.getsize(path), True), _zckpt_threads())


def _zckpt_threads():
    return max(2, min(8, (os.cpu_count() or 2) // 2))


# In place: the destination tensors exist (zeroed, so faulted in) before the clock starts, as on
# a resume; each contender fills them and returns them. zckpt's and safetensors' files hold the
# same tensors under the same names, so one set of shapes serves both.
_TARGETS = None


def prepare_targets(path):
    global _TARGETS
    import torch

    if path.endswith(".safetensors"):
        from safetensors import safe_open

        with safe_open(path, framework="pt") as f:
            _TARGETS = {k: torch.zeros_like(f.get_slice(k)[:]) for k in f.keys()}
    else:
        import zckpt

        _TARGETS = {k: torch.zeros_like(t) for k, t in zckpt.load(path, mmap=True, verify=False).items()}


def load_zckpt_into(path):
    import zckpt

    zckpt.load_into(path, _TARGETS)
    return _TARGETS


def load_zckpt_into_noverify(path):
    import zckpt

    zckpt.load_into(path, _TARGETS, verify=False)
    return _TARGETS


def load_safetensors_into(path):
    """safetensors' own in-place recipe: safe_open (a mapping) and copy_ into each tensor."""
    from safetensors import safe_open

    with safe_open(path, framework="pt") as f:
        for k in f.keys():
            _TARGETS[k].copy_(f.get_tensor(k))
    return _TARGETS


def load_zckpt_mmap_noverify(path):
    import zckpt

    sd = zckpt.load(path, mmap=True, verify=False)
    read_every_byte(sd)
    return sd


# The in-place floors: the file's bytes into memory faulted in beforehand, nothing checked, from
# as many threads as zckpt's default readers: with pread (the kernel copies) and with memcpy out
# of a mapping of the file (what safetensors' copy_ does, without its per-tensor steps).
_FAULTED = None


def prepare_faulted(path):
    global _FAULTED
    _FAULTED = _fresh(os.path.getsize(path), True)
    _FAULTED.write(b"\1" * len(_FAULTED))  # every page written: faulted in whatever the kernel


def load_floor_pread_faulted(path):
    """pread into memory already faulted in, N threads."""
    return _pread_parallel(path, _FAULTED, _zckpt_threads())


def load_floor_memcpy_faulted(path):
    """memcpy (ctypes.memmove, which runs without the GIL) from a mapping of the file into memory
    already faulted in, in 8 MiB pieces shared out to N threads."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        src = mmap.mmap(f.fileno(), size, access=mmap.ACCESS_COPY)  # private: readable through ctypes
    src_at = ctypes.addressof((ctypes.c_char * size).from_buffer(src))
    dst_at = ctypes.addressof((ctypes.c_char * size).from_buffer(_FAULTED))
    _in_pieces(size, _zckpt_threads(), lambda off, end: ctypes.memmove(dst_at + off, src_at + off, end - off))
    return _FAULTED


def load_zckpt_py_cuda(path):
    import zckpt

    return zckpt.load(path, map_location="cuda")


def load_zckpt_py_cuda_noverify(path):
    import zckpt

    return zckpt.load(path, map_location="cuda", verify=False)


def load_torch_cuda(path):
    import torch

    return torch.load(path, map_location="cuda", weights_only=True)


def load_safetensors_cuda(path):
    from safetensors.torch import load_file

    return load_file(path, device="cuda")


def load_fastsafetensors_cuda(path):
    from fastsafetensors import SafeTensorsFileLoader

    loader = SafeTensorsFileLoader(None, "cuda:0", nogds=True)
    loader.add_filenames({0: [path]})
    fb = loader.copy_files_to_device()
    return _Keep({k: fb.get_tensor(k) for k in loader.get_keys()}, (fb, loader))


_PINNED = None


def prepare_pinned(path):
    global _PINNED
    import torch

    _PINNED = torch.ones(os.path.getsize(path), dtype=torch.uint8).pin_memory()


def load_floor_pinned_h2d(path):
    """One pinned host buffer of the file's size copied to the device (the PCIe floor)."""
    import torch

    dst = torch.empty(_PINNED.numel(), dtype=torch.uint8, device="cuda")
    dst.copy_(_PINNED, non_blocking=True)
    return dst


CONTENDERS = {
    "zckpt_py_cuda": load_zckpt_py_cuda,
    "zckpt_py_cuda_noverify": load_zckpt_py_cuda_noverify,
    "torch_cuda": load_torch_cuda,
    "safetensors_cuda": load_safetensors_cuda,
    "fastsafetensors_cuda": load_fastsafetensors_cuda,
    "floor_pinned_h2d": load_floor_pinned_h2d,
    "zckpt_py": load_zckpt_py,
    "zckpt_py_noverify": load_zckpt_py_noverify,
    "zckpt_mmap": load_zckpt_mmap,
    "torch": load_torch,
    "torch_mmap": load_torch_mmap,
    "safetensors": load_safetensors,
    "tensorizer": load_tensorizer,
    "tensorizer_verified": load_tensorizer_verified,
    "fastsafetensors": load_fastsafetensors,
    "runai": load_runai,
    "floor_read_1t": load_floor_read_1t,
    "floor_pread_tricks": load_floor_pread_tricks,
    "zckpt_into_py": load_zckpt_into,
    "zckpt_into_py_noverify": load_zckpt_into_noverify,
    "safetensors_into": load_safetensors_into,
    "zckpt_mmap_noverify": load_zckpt_mmap_noverify,
    "floor_pread_faulted": load_floor_pread_faulted,
    "floor_memcpy_faulted": load_floor_memcpy_faulted,
}

# What each needs imported before the clock starts (so the timing is the load, not the import).
IMPORTS = {
    "zckpt_py": ["torch", "zckpt"], "zckpt_py_noverify": ["torch", "zckpt"], "zckpt_mmap": ["torch", "zckpt"],
    "torch": ["torch"], "torch_mmap": ["torch"], "safetensors": ["torch", "safetensors.torch"],
    "tensorizer": ["torch", "tensorizer"], "tensorizer_verified": ["torch", "tensorizer"],
    "fastsafetensors": ["torch", "fastsafetensors"], "runai": ["torch", "runai_model_streamer"],
    "floor_read_1t": [], "floor_pread_tricks": [],
    "zckpt_into_py": ["torch", "zckpt"], "zckpt_into_py_noverify": ["torch", "zckpt"],
    "safetensors_into": ["torch", "safetensors"], "zckpt_mmap_noverify": ["torch", "zckpt"],
    "floor_pread_faulted": [], "floor_memcpy_faulted": [],
    "zckpt_py_cuda": ["torch", "zckpt"], "zckpt_py_cuda_noverify": ["torch", "zckpt"], "torch_cuda": ["torch"], "safetensors_cuda": ["torch", "safetensors.torch"],
    "fastsafetensors_cuda": ["torch", "fastsafetensors"], "floor_pinned_h2d": ["torch"],
}
PREPARE = {"floor_pinned_h2d": prepare_pinned, "zckpt_into_py": prepare_targets,
           "zckpt_into_py_noverify": prepare_targets, "safetensors_into": prepare_targets,
           "floor_pread_faulted": prepare_faulted, "floor_memcpy_faulted": prepare_faulted}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("kind", choices=sorted(CONTENDERS))
    ap.add_argument("file")
    ap.add_argument("--cache", default="warm", choices=["warm", "fadvise", "drop"])
    ap.add_argument("--digest", action="store_true")
    ap.add_argument("--tensor-digests", action="store_true")
    args = ap.parse_args()
    import importlib

    for m in IMPORTS[args.kind]:
        importlib.import_module(m)
    fn = CONTENDERS[args.kind]
    cuda = "_cuda" in args.kind or args.kind == "floor_pinned_h2d"
    if cuda:
        import torch

        torch.zeros(1, device="cuda")  # the CUDA context, outside the timing
        torch.cuda.reset_peak_memory_stats()
        dev_before = torch.cuda.memory_allocated()
        reserved_before = torch.cuda.memory_reserved()
        free_before = torch.cuda.mem_get_info()[0]
    if args.kind in PREPARE:
        PREPARE[args.kind](args.file)
    if "://" in args.file:
        if args.cache != "warm":
            ap.error("an object-store URL has no page cache to evict")
        resident = None
    else:
        resident = prepare_cache(args.file, args.cache)
    reset_peak()
    before = host_memory()["VmRSS"]
    c0 = cpu_seconds()
    t0 = time.perf_counter()
    result = fn(args.file)
    if cuda:
        torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    out = {"seconds": seconds, "cpu_seconds": cpu_seconds() - c0, "rss_before": before,
           "rss_peak": host_memory()["VmHWM"], "resident_before": resident}
    if cuda:  # read while `result` is alive
        out["device_peak"] = torch.cuda.max_memory_allocated() - dev_before
        out["device_reserved_peak"] = torch.cuda.max_memory_reserved() - reserved_before
        out["device_used"] = free_before - torch.cuda.mem_get_info()[0]
    if args.digest and not args.kind.startswith("floor"):
        out["digest"] = digest(result)
    if args.tensor_digests:
        out["digests"] = tensor_digests(result)
    print(json.dumps(out))
    sys.stdout.flush()
    os._exit(0)  # skip teardown (freeing GiBs, peers' atexit hooks): not part of any load


if __name__ == "__main__":
    main()
