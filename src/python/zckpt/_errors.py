"""zckpt's error classes: one per kind of include/zckpt/error.h, each a ZckptError, raised by the
torch-free `_core` (and the tests' `_C`) from the kind a core call failed with (`for_kind`).

Every ZckptError has `kind`, error.h's name for its kind ("io", "not-a-container", "corrupt",
"unsupported", "unsafe", "invalid-argument", "cancelled", "out-of-memory"; None for an error the
Python layer raises that is none of them), and, as attributes, where the error lies: file,
storage, tensors, chunk, file_bytes and storage_bytes ((begin, end)), None for what it is not
about. Where a Python builtin means the same, the class is also that builtin (IoError an OSError,
InvalidArgumentError a ValueError), so `except OSError` around a load sees a file it cannot read."""

# Where an error lies, an attribute of every error class: None for what it is not about.
PLACE = ("file", "storage", "tensors", "chunk", "file_bytes", "storage_bytes")


class ZckptError(RuntimeError):
    """A zckpt failure; `kind` names its kind (error.h's name; None when raised by the Python
    layer as none of them) and its attributes say where: file, storage, tensors, chunk,
    file_bytes and storage_bytes ((begin, end)), None for what it is not about."""

    kind = None


class IoError(ZckptError, OSError):
    """Opening, reading, writing, mapping or syncing a file failed (the system's reason in the
    message); also an OSError, whose errno and strerror are None (the message says it)."""

    kind = "io"


class NotAContainerError(ZckptError):
    """The file is not a zckpt container (or, where one is read, not a torch.save or safetensors
    file) at all: wrong magic, too short to hold one."""

    kind = "not-a-container"


class CorruptError(ZckptError):
    """The file is damaged or forged: a checksum, a structure or a record does not hold."""

    kind = "corrupt"


class UnsupportedError(ZckptError):
    """The file is valid but uses a format version or feature this build does not implement."""

    kind = "unsupported"


class UnsafeError(ZckptError):
    """A pickle names a global that could run code, or one not known to be data: refused."""

    kind = "unsafe"


class InvalidArgumentError(ZckptError, ValueError):
    """The caller asked for something that cannot be done (an option out of range, an export
    format that does not exist, ...); also a ValueError."""

    kind = "invalid-argument"


class CancelledError(ZckptError):
    """Stopped on request before it finished."""

    kind = "cancelled"


class OutOfMemoryError(ZckptError):
    """Host memory for a load could not be had (zckpt/_oom.py's subclass is also torch's)."""

    kind = "out-of-memory"


class IncompleteCheckpointError(ZckptError):
    """A checkpoint folder whose files an asynchronous save was still writing when the process
    that saved it stopped (its `zckpt-incomplete.rank<R>` marks are there): it is not a
    checkpoint, and a resume from it would miss what was not written. `file` is the folder."""


for _field in PLACE:
    setattr(ZckptError, _field, None)

# kind -> the class a core error of that kind is raised as; a kind not here (none today) is a
# plain ZckptError carrying it.
_CLASSES = {cls.kind: cls for cls in (IoError, NotAContainerError, CorruptError, UnsupportedError, UnsafeError,
                                      InvalidArgumentError, CancelledError, OutOfMemoryError)}
for _cls in (ZckptError, IncompleteCheckpointError, *_CLASSES.values()):
    _cls.__module__ = "zckpt"


def set_out_of_memory_error(cls):
    """From now on out-of-memory errors are `cls` (zckpt/_oom.py's, also a torch.OutOfMemoryError)."""
    _CLASSES["out-of-memory"] = cls


def for_kind(kind, message, place=None):
    """The error a core call that failed with `kind` raises: its class, `message`, and `place`'s
    fields (PLACE; byte ranges as (begin, end) tuples) as attributes."""
    cls = _CLASSES.get(kind)
    err = cls(message) if cls is not None else ZckptError(message)
    if cls is None:
        err.kind = kind
    for field in PLACE:
        setattr(err, field, _place_value(field, (place or {}).get(field)))
    return err


def problem(found):
    """A problem as the core's verify and verify_chunks give it (a dict of "kind", "message" and
    PLACE) with its byte ranges as (begin, end) tuples, as an error's attributes are."""
    return {field: _place_value(field, value) for field, value in found.items()}


def _place_value(field, value):
    return tuple(value) if field.endswith("_bytes") and value is not None else value


def findings_error(message, problems):
    """The CorruptError of a check that found `problems` (dicts of PLACE with "kind", "corrupt" or
    "unsafe", and "message", as the core's verify and verify_chunks give them, in order), with
    `message`, the problems as its `problems` and the first one's place as its own attributes."""
    err = for_kind("corrupt", message, problems[0])
    err.problems = problems
    return err
