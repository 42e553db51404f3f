"""zckpt as the storage layer of torch.distributed.checkpoint (DCP).

    import torch.distributed.checkpoint as dcp
    from zckpt.dcp import ZckptStorageReader, ZckptStorageWriter

    dcp.save(state, storage_writer=ZckptStorageWriter("ckpt/step_100"))
    dcp.load(state, storage_reader=ZckptStorageReader("ckpt/step_100"))   # any world size

The folder may be an object folder in S3-compatible storage, "s3://BUCKET/PREFIX/step_100"
(configured from the AWS environment variables, src/remote/README.md): the containers are
uploaded and read by the C++ library (multipart uploads; ranged GETs pinned to the object's
ETag, damaged chunks fetched again), `.metadata` is one PUT written last and one GET.

DCP plans which rank writes and reads which piece of which tensor (and reshards between world
sizes); zckpt stores the pieces. A save writes one container per rank, `__<rank>_0.zckpt`, each
saved tensor piece a checksummed storage of its own, each non-tensor item (DCP's BytesIO items:
learning rates, steps, ...) a blob, plus DCP's `.metadata` as `FileSystemWriter` writes it. A
load reads, per container, only the chunks overlapping the pieces this rank asked for, checks
each chunk's XXH3, and writes the bytes into the tensors the planner hands over
(`resolve_tensor`): straight into a CPU or CUDA tensor when the box is one contiguous byte run
(CUDA through the loader's pinned ring), through a bounded host staging buffer and copy_()
otherwise (strided boxes, other dtypes; zckpt/_regions.py). A corrupt chunk fails the load with `zckpt.CorruptError` naming the file,
the storage, its tensors and the byte range.

Both directions run on the torch-free `zckpt._core` and torch's Python API only, so this module
works under every torch 2.x the package supports.

Folders written by DCP's own `FileSystemWriter` (`*.distcp`) become this layout with
`zckpt convert DIR -o OUT` (no Python, no torch), and go back byte for byte with
`zckpt export OUT -o DIR2`; `ZckptStorageReader` reads both layouts' `.metadata`.

`.metadata` is a pickle. It is never given to Python's unpickler before zckpt's own interpreter
has read it (nothing runs there) and found only the classes DCP's metadata is made of; then an
unpickler that can construct exactly those classes, and nothing else, builds the objects.
The BytesIO items are torch.save archives that DCP's planner unpickles with
`torch.load(weights_only=False)`; the reader vets each one with zckpt's interpreter first and
refuses (`zckpt.UnsafeError`) one naming a global that could run code.

Layout of a tensor piece in a container (format-spec/folders.md): storage key the decimal
write order (native) or the piece's byte offset in its source `.distcp` (converted), a tensor
record named after the piece (`fqn`, or `fqn@o0,o1,...` for a piece not at the origin) whose
`extra` JSON is {"fqn", "global_shape", "shard_offsets", "shard_sizes", "class"}: each
container says on its own which piece of which tensor it holds.
"""
import contextlib
import dataclasses
import io
import json
import os
import pickle
import uuid

import torch
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.metadata import Metadata, MetadataIndex, StorageMeta
from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, LoadPlanner, SavePlan, SavePlanner, WriteItemType
from torch.distributed.checkpoint.storage import StorageReader, StorageWriter, WriteResult
from torch.futures import Future

from . import _core, _paths
from ._errors import CorruptError, ZckptError
from ._arg_checks import allowed_globals as _allowed
from ._arg_checks import size
from ._regions import load_regions, storage_tensors
from ._writer import write_tensor

__all__ = ["ZckptStorageWriter", "ZckptStorageReader", "load_metadata", "is_zckpt_folder",
           "zckpt_errors_unwrapped"]

# DCP's names in a folder and a container, as the core has them (checkpoint/dcp_layout.h).
_NAMES = _core.format_constants()["dcp"]
METADATA_NAME = _NAMES["metadata_name"]
SUFFIX = _NAMES["container_suffix"]
DCP_CLASS = _NAMES["piece_class"]
BYTES_PREFIX = _NAMES["bytes_blob_prefix"]
# Converted folders (zckpt convert of a FileSystemWriter folder) name pieces by source offset.
CONVERTED_BYTES_PREFIX = _NAMES["bytes_at_blob"]
# Rank 0's container, in every folder ZckptStorageWriter wrote (prepare_global_plan names rank i's
# pieces `__<i>_`, and each rank writes one container) and in every converted one.
RANK0_CONTAINER = f"__0_0{SUFFIX}"


def piece_name(fqn, offsets):
    """The tensor record name of a saved piece: the fqn, with its offsets when not at the origin."""
    if any(offsets):
        return f"{fqn}@{','.join(str(int(o)) for o in offsets)}"
    return fqn


def _piece_extra(item):
    td = item.tensor_data
    return json.dumps({"fqn": item.index.fqn, "global_shape": [int(s) for s in td.size],
                       "shard_offsets": [int(o) for o in td.chunk.offsets],
                       "shard_sizes": [int(s) for s in td.chunk.sizes], "class": DCP_CLASS},
                      separators=(",", ":"))


# Local: temporary, fsync, rename, fsync of the folder (the C++ AtomicFile), only a regular file
# (or nothing) at `path` replaced; an object: one PUT.
_write_atomic = _paths.write_atomically


class ZckptStorageWriter(StorageWriter):
    """Writes a DCP checkpoint as one zckpt container per rank plus DCP's `.metadata`.

    chunk_bytes / zstd_level / threads are the container writer's options (default 4 MiB chunks,
    no compression, all cores hashing). Tensors on a device are copied out 64 MiB at a time.
    Each container appears only complete (temporary, fsync, rename); `.metadata` last, written
    the same way by the coordinator, so a folder with `.metadata` is a whole checkpoint.

    `path` may be an object folder, s3://BUCKET/PREFIX: each rank's container is uploaded by the
    C++ writer as it is written (multipart past its first 5 MiB part), and `.metadata` is one PUT
    after every container is complete, so there too a folder with `.metadata` is whole."""

    def __init__(self, path, *, chunk_bytes=0, zstd_level=0, threads=0, overwrite=True):
        super().__init__()
        self.path = os.fspath(path)
        self.chunk_bytes = size("chunk_bytes", chunk_bytes) or 0
        self.zstd_level = zstd_level
        self.threads = size("threads", threads) or 0
        self.overwrite = overwrite
        self.save_id = str(uuid.uuid4())
        self.rank = None
        self.use_collectives = True

    def reset(self, checkpoint_id=None):
        if checkpoint_id:
            self.path = os.fspath(checkpoint_id)
        self.save_id = str(uuid.uuid4())

    def set_up_storage_writer(self, is_coordinator, *args, **kwargs):
        self.rank = kwargs.get("rank")
        self.use_collectives = kwargs.get("use_collectives", True)

    def _metadata_path(self):
        if not self.use_collectives and self.rank is not None:
            return _paths.join(self.path, f"__{self.rank}{METADATA_NAME}")
        return _paths.join(self.path, METADATA_NAME)

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        _paths.makedirs(self.path)
        if not self.overwrite and _paths.exists(self._metadata_path()):
            raise RuntimeError(f"{self.path}: a checkpoint already exists there and overwrite=False")
        if not self.use_collectives and self.rank is not None:
            plan = dataclasses.replace(plan, storage_data=f"__{self.rank}_")
        return plan

    def prepare_global_plan(self, plans):
        return [p if p.storage_data is not None else dataclasses.replace(p, storage_data=f"__{i}_")
                for i, p in enumerate(plans)]

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future:
        relative = f"{plan.storage_data}0{SUFFIX}"
        writer = _core.ContainerWriter(_paths.join(self.path, relative), self.chunk_bytes, self.zstd_level,
                                       self.threads)
        results, names = [], set()

        def unique(name):
            base, k = name, 1
            while name in names:
                name, k = f"{base}#{k}", k + 1
            names.add(name)
            return name

        for n, item in enumerate(plan.items):
            if item.type == WriteItemType.BYTE_IO:
                data = planner.resolve_data(item)
                payload = data.getvalue() if isinstance(data, io.BytesIO) else bytes(data.getbuffer())
                name = unique(BYTES_PREFIX + item.index.fqn)
                writer.add_blob(name, payload)
                size = len(payload)
            else:
                tensor = planner.resolve_data(item)  # lazily, one at a time: it may allocate
                name = unique(piece_name(item.index.fqn, item.tensor_data.chunk.offsets))
                size = write_tensor(writer, str(n), name, tensor, _piece_extra(item))
                del tensor
            results.append(WriteResult(index=item.index, size_in_bytes=size, storage_data=(relative, name)))
        writer.set_metadata("zckpt.dcp.save_id", self.save_id)
        writer.commit()
        fut = Future()
        fut.set_result(results)
        return fut

    def finish(self, metadata: Metadata, results) -> None:
        metadata.storage_data = {wr.index: wr.storage_data for rank_results in results for wr in rank_results}
        metadata.storage_meta = self.storage_meta()
        if hasattr(metadata, "version"):
            metadata.version = "1.0.0"  # as FileSystemWriter (torch's CURRENT_DCP_VERSION)
        _write_atomic(self._metadata_path(), pickle.dumps(metadata))

    def storage_meta(self):
        return StorageMeta(checkpoint_id=self.path, save_id=self.save_id)

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id) -> bool:
        return _is_local_or_object(checkpoint_id)

    @property
    def checkpoint_id(self):
        return self.path


# ----- reading .metadata: zckpt's interpreter first, then an unpickler limited to DCP's classes --

_META = "torch.distributed.checkpoint.metadata"
_ALLOWED_CLASSES = {
    (_META, "Metadata"), (_META, "TensorStorageMetadata"), (_META, "BytesStorageMetadata"),
    (_META, "ChunkStorageMetadata"), (_META, "TensorProperties"), (_META, "MetadataIndex"),
    (_META, "StorageMeta"), (_META, "_MEM_FORMAT_ENCODING"),
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch", "Size"), ("torch.serialization", "_get_layout"), ("collections", "OrderedDict"),
    ("pathlib", "PosixPath"), ("pathlib", "PurePosixPath"), ("pathlib", "WindowsPath"),
    ("pathlib", "PureWindowsPath"),
}


def _enum_member(cls, name):
    """getattr as Python pickles an Enum member, (getattr, (its class, its name)), which torch
    2.4-2.9 write for TensorProperties' memory format: _MEM_FORMAT_ENCODING's members only."""
    from torch.distributed.checkpoint.metadata import _MEM_FORMAT_ENCODING

    if cls is _MEM_FORMAT_ENCODING and isinstance(name, str) and name in _MEM_FORMAT_ENCODING.__members__:
        return _MEM_FORMAT_ENCODING[name]
    raise pickle.UnpicklingError(f"DCP metadata asks for attribute {name!r} of {cls!r}, which is not a member "
                                 "of DCP's memory-format enum")


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module, name):
        if (module, name) in _ALLOWED_CLASSES:
            return super().find_class(module, name)
        if (module, name) == ("builtins", "getattr"):
            return _enum_member
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise pickle.UnpicklingError(f"DCP metadata names {module}.{name}, which is not one of the classes "
                                     "DCP's metadata is made of")


def _is_local_or_object(checkpoint_id):
    """A local path or an s3:// URL (no other scheme: fsspec's belong to FileSystemWriter)."""
    return "://" not in str(checkpoint_id) or _paths.is_url(str(checkpoint_id))


def is_zckpt_folder(path):
    """Whether the DCP folder `path` (local or s3://) holds zckpt containers: one for
    ZckptStorageReader, not for DCP's FileSystemReader."""
    return _paths.isfile(_paths.join(os.fspath(path), RANK0_CONTAINER))


def load_metadata(path) -> Metadata:
    """The Metadata of a DCP folder (or of a `.metadata` file), local or s3://, read safely: see
    the module doc."""
    path = os.fspath(path)
    if _paths.isdir(path):
        path = _paths.join(path, METADATA_NAME)
    return _read_metadata_file(path)


def _read_metadata_file(path):
    data = _paths.read_bytes(path)  # a local FIFO or device is refused, never blocks
    _core.check_dcp_metadata(data, path)  # zckpt's interpreter: UnsafeError / CorruptError
    metadata = _MetadataUnpickler(io.BytesIO(data)).load()
    if not isinstance(metadata, Metadata):
        raise CorruptError(f"{path}: not DCP metadata (a {type(metadata).__name__})")
    return metadata


def check_tiling(metadata, path):
    """Every tensor's saved chunks must tile it: inside it, pairwise disjoint unless they are the
    same box (a replica), together all its elements. DCP's planner reads every chunk that
    overlaps a destination, so chunks that overlap otherwise would leave whichever was read last,
    and a gap would leave the destination's own values: CorruptError naming the folder, the
    tensor and the chunks, before anything is read. (Identical boxes need no byte comparison
    here: DCP's storage_data is keyed by (fqn, offsets), so they name one stored piece.)"""
    import math

    for fqn, item in metadata.state_dict_metadata.items():
        size = getattr(item, "size", None)
        if size is None:  # BytesStorageMetadata
            continue
        boxes = []
        for c in item.chunks:
            box = (tuple(int(o) for o in c.offsets), tuple(int(n) for n in c.sizes))
            if len(box[0]) != len(size) or len(box[1]) != len(size) or any(
                    o < 0 or n < 0 or o + n > s for o, n, s in zip(box[0], box[1], size)):
                raise CorruptError(f"{path}: tensor '{fqn}' {list(size)}: a chunk at {list(box[0])} size "
                                      f"{list(box[1])} lies outside it")
            if math.prod(box[1]) and box not in boxes:
                boxes.append(box)
        for i, (ao, an) in enumerate(boxes):
            for bo, bn in boxes[i + 1:]:
                if all(a < b + m and b < a + n for a, n, b, m in zip(ao, an, bo, bn)):
                    raise CorruptError(f"{path}: tensor '{fqn}' {list(size)}: chunks at {list(ao)} size {list(an)} "
                                          f"and at {list(bo)} size {list(bn)} overlap: pieces that neither tile the "
                                          "tensor nor are replicas of one box")
        covered = sum(math.prod(n) for _, n in boxes)
        if covered != math.prod(size):
            raise CorruptError(f"{path}: tensor '{fqn}' {list(size)}: its {len(boxes)} chunks cover {covered} of "
                                  f"its {math.prod(size)} elements (missing ranks or shards?)")


class ZckptStorageReader(StorageReader):
    """Reads a DCP checkpoint written by ZckptStorageWriter (or converted by `zckpt convert`).

    verify=False skips the per-chunk checksum (zstd frames are still checked whole).
    Non-tensor items (DCP's BytesIO: torch.save of Python values, which DCP's planner unpickles
    without weights_only) are read by zckpt's interpreter first and refused (UnsafeError) if they
    name a global off its allowlist, unless listed in allow_globals ('module.name' strings,
    classes or functions, as for zckpt.load); globals that could run code are refused whatever.
    `last_read` holds, after each read_data, what this rank read: regions, chunks, stored_bytes
    (bytes of the chunks read from the files), and the containers it touched.
    `path` may be an object folder, s3://BUCKET/PREFIX (either layout): `.metadata` is one GET,
    each container is read with ranged GETs of the chunks the pieces need."""

    def __init__(self, path, *, verify=True, allow_globals=()):
        super().__init__()
        self.path = os.fspath(path)
        self.verify = verify
        self.allow_globals = _allowed(allow_globals)
        self.storage_data = {}
        self.load_id = str(uuid.uuid4())
        self.last_read = {}
        self._storage_tensors = {}
        self._present = {}  # converted layout: container path -> whether it is there

    def reset(self, checkpoint_id=None):
        self.storage_data = {}
        if checkpoint_id:
            self.path = os.fspath(checkpoint_id)
        self.load_id = str(uuid.uuid4())
        self._storage_tensors = {}
        self._present = {}

    def read_metadata(self, *args, **kwargs) -> Metadata:
        rank = kwargs.get("rank")
        name = METADATA_NAME if rank is None else f"__{rank}{METADATA_NAME}"
        path = _paths.join(self.path, name)
        metadata = _read_metadata_file(path)
        check_tiling(metadata, path)
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata

    def set_up_storage_reader(self, metadata, is_coordinator, *args, **kwargs):
        if metadata.storage_data is None:
            raise CorruptError(f"{self.path}: the metadata has no storage_data")
        self.storage_data = metadata.storage_data

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        return plan

    def prepare_global_plan(self, plans):
        return plans

    def _locate(self, item):
        """(container path, tensor or blob name) of a ReadItem's saved piece."""
        info = self.storage_data.get(item.storage_index)
        if info is None:
            raise CorruptError(f"{self.path}: the metadata has no storage entry for {item.storage_index}")
        if isinstance(info, tuple) and len(info) == 2:  # written by ZckptStorageWriter
            return _paths.join(self.path, info[0]), info[1]
        relative = getattr(info, "relative_path", None)
        if relative is None:
            raise CorruptError(f"{self.path}: storage entry {info!r} of {item.storage_index} is neither zckpt's "
                                  "nor FileSystemWriter's")
        # A FileSystemWriter folder converted by `zckpt convert`: X.distcp became X.zckpt, and a
        # piece is found by its byte offset in X.distcp (storage key / blob name).
        stem = relative[:-len(".distcp")] if relative.endswith(".distcp") else relative
        path = _paths.join(self.path, stem + SUFFIX)
        if path not in self._present:  # one check (a HEAD for an object) per container
            self._present[path] = _paths.isfile(path)
        if not self._present[path]:
            raise ZckptError(f"{path}: missing; {self.path} is a DCP folder of FileSystemWriter's layout "
                                f"({relative}): read it with FileSystemReader, or convert it with 'zckpt convert'")
        if item.type == LoadItemType.BYTE_IO:
            return path, f"{CONVERTED_BYTES_PREFIX}{info.offset}"
        if path not in self._storage_tensors:
            self._storage_tensors[path] = storage_tensors(path)
        names = self._storage_tensors[path].get(str(info.offset))
        if not names:
            raise CorruptError(f"{path}: no piece at source offset {info.offset} (for {item.storage_index})")
        return path, names[0]

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future:
        per_file = {}
        for item in plan.items:
            path, name = self._locate(item)
            per_file.setdefault(path, []).append((item, name))
        read = {"regions": 0, "chunks": 0, "stored_bytes": 0, "files": []}
        for path, items in per_file.items():
            blobs = [(item, name) for item, name in items if item.type == LoadItemType.BYTE_IO]
            tensors = [(item, name) for item, name in items if item.type != LoadItemType.BYTE_IO]
            if blobs:
                for (item, _), data in zip(blobs, _core.read_dcp_blobs(path, [n for _, n in blobs], self.allow_globals)):
                    planner.load_bytes(item, io.BytesIO(data))
            if tensors:
                targets = [planner.resolve_tensor(item).detach() for item, _ in tensors]
                regions = [(name, list(item.storage_offsets), list(item.lengths), target)
                           for (item, name), target in zip(tensors, targets)]
                stats = load_regions(path, regions, self.verify)
                for (item, _), target in zip(tensors, targets):
                    planner.commit_tensor(item, target)
                read["regions"] += stats["regions"]
                read["chunks"] += stats["chunks"]
                read["stored_bytes"] += stats["stored_bytes"]
            read["files"].append(path)
        self.last_read = read
        fut = Future()
        fut.set_result(None)
        return fut

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id) -> bool:
        return _is_local_or_object(checkpoint_id) and _paths.isdir(os.fspath(checkpoint_id))

    @property
    def checkpoint_id(self):
        return self.path


# ----- for integrations that hand DCP a folder by name ------------------------------------------


@contextlib.contextmanager
def zckpt_errors_unwrapped():
    """Inside the block, DCP's CheckpointException that carries a ZckptError (the lowest rank's,
    which DCP gathers onto every rank) is raised as that ZckptError: a corrupt chunk stops every
    rank with CorruptError naming the file and the chunk. Other exceptions pass unchanged."""
    try:
        yield
    except CheckpointException as e:
        failures = getattr(e, "failures", None) or {}
        for rank in sorted(failures):
            if isinstance(failures[rank][0], ZckptError):
                raise failures[rank][0] from e
        raise
