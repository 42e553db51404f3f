"""The one shape of a container's tensor records in the package: `Record`, made once per record
from the core's `tensor_records` answer, with the format's tensor flags as the core gives them."""
import json
from typing import NamedTuple

from . import _core

_FLAGS = _core.format_constants()["tensor_flags"]  # flag name -> bit (include/zckpt/format.h)


def _flag(name, doc):
    bit = _FLAGS[name]
    return property(lambda record: bool(record.flags & bit), doc=doc)


class Record(NamedTuple):
    """One tensor record: its name, dtype (zckpt's name, torch's), shape and stride (elements),
    flags, extra (JSON text; `extra_fields` parsed), and where its bytes lie: the storage's index
    in the file, the view's storage_offset (elements) and the raw byte range [byte_begin,
    byte_end) it touches (empty for no elements)."""

    name: str
    dtype: str
    shape: tuple
    stride: tuple
    flags: int
    extra: str
    storage: int
    storage_offset: int
    byte_begin: int
    byte_end: int

    @property
    def extra_fields(self):
        return json.loads(self.extra) if self.extra else {}

    sharded = _flag("sharded", "A ShardedTensor's local shard (FSDP1's SHARDED_STATE_DICT).")
    dtensor = _flag("dtensor", "A DTensor's local tensor (FSDP2).")
    internal = _flag("internal", "Inside another object's metadata (a DTensor's DeviceMesh): not a state entry.")
    quantized = _flag("quantized", "A quantized tensor (its quantizer lives in the pickle).")
    conj = _flag("conj", "Saved with torch's conj bit: its bytes are the conjugates of its values.")
    neg = _flag("neg", "Saved with torch's neg bit: its bytes are the negatives of its values.")


def _made(answer):
    return [Record(d["name"], d["dtype"], tuple(d["shape"]), tuple(d["stride"]), d["flags"], d["extra"],
                   d["storage"], d["storage_offset"], d["byte_begin"], d["byte_end"]) for d in answer]


def of_checkpoint(ckpt):
    """The records of an open `_core.Checkpoint`, in the file's order."""
    return _made(ckpt.tensor_records())


def of_path(path):
    """The records of the container at `path` (its index only is read), in the file's order."""
    return _made(_core.tensor_records(path))


def by_name(records):
    """name -> the first record of that name."""
    out = {}
    for r in records:
        out.setdefault(r.name, r)
    return out
