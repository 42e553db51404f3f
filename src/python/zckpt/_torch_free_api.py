"""The torch-free entry points: convert, export and verify run on zckpt._core, so they work
where torch is not installed (as the `zckpt` command does)."""
from . import _core
from ._arg_checks import allowed_globals, path_of, size
from ._errors import findings_error


def convert(src, dst=None, *, chunk_bytes=0, zstd_level=0, threads=0, allow_globals=()):
    """Converts a torch.save file to a container (no Python code from the file runs): its
    pickle's globals must be on zckpt's allowlist of data globals or in allow_globals
    ('module.name' strings or the classes themselves); UnsafeError otherwise. chunk_bytes and
    threads: 0 or None for the default (4 MiB chunks, all cores), as `zckpt convert`.
    Returns a dict of statistics."""
    src = path_of(src)
    return _core.convert(src, path_of(dst) if dst is not None else "", size("chunk_bytes", chunk_bytes) or 0,
                         zstd_level, size("threads", threads) or 0, allowed_globals(allow_globals))


def export(src, dst, *, format=None, allow_globals=()):
    """Writes a container back as a .pt file that torch.load reads (format="pt"), or as a
    .safetensors file (format="safetensors"; the default when dst ends in .safetensors). The
    object pickle (every pickle torch.load will read) is vetted first (allowlist plus
    allow_globals, checked against the index), and the archive is checked complete and safe to
    unpack."""
    dst = path_of(dst)
    if format is None:
        format = "safetensors" if dst.endswith(".safetensors") else "pt"
    _core.export(path_of(src), dst, format, allowed_globals(allow_globals))


def verify(path, *, threads=None, raise_on_error=True):
    """Checks every byte of a container, and that its kept pickle is readable, names no
    code-running global and describes the same tensors as its index, on `threads` checking
    threads per file (None or 0: all cores, as `zckpt verify --threads`). Returns the list of
    problems (messages; empty when good); with raise_on_error, raises CorruptError listing them
    instead. That CorruptError's `problems` holds each one as a dict: "kind" ("corrupt" or
    "unsafe"), "message", and where it lies, "file", "storage", "tensors" (a list), "chunk",
    "file_bytes" and "storage_bytes" ((begin, end) byte ranges), None for what it is not about;
    its own attributes of those names are the first problem's (as every ZckptError's are its
    own). A file that could not be checked at all (missing, unreadable, not a container,
    unsupported) raises its ZckptError, where `zckpt verify` exits 2."""
    found = _core.verify(path_of(path), size("threads", threads))
    problems = [p["message"] for p in found]
    if problems and raise_on_error:
        raise findings_error("\n".join(problems), found)
    return problems
