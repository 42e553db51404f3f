"""Replaying a kept torch.save pickle with storages supplied by zckpt.

Mirrors what `torch.serialization._load` does for zip archives and `_legacy_load` for the
legacy format, except that storages are not read from the archive: they are handed in,
already on their destination device.
"""
import io
import pickle

import torch


def _storage_dtype(storage_type):
    # `torch.UntypedStorage` in newer files, `torch.FloatStorage`-style classes otherwise.
    if storage_type is torch.UntypedStorage or getattr(storage_type, "__name__", "") == "UntypedStorage":
        return torch.uint8
    return storage_type.dtype


def _typed(untyped, dtype):
    return torch.storage.TypedStorage(wrap_storage=untyped, dtype=dtype, _internal=True)


class _Unpickler(pickle.Unpickler):
    # torch.load's own renames for files from older releases.
    def find_class(self, mod_name, name):
        if type(name) is str and "Storage" in name:
            try:
                return torch.serialization.StorageType(name)
            except KeyError:
                pass
        if mod_name == "torch.tensor":
            mod_name = "torch._tensor"
        return super().find_class(mod_name, name)


def unpickle(data, storage_for_key, weights_only, legacy):
    """Runs torch's unpickler over `data`; `storage_for_key(key, location, dtype)` returns an
    untyped storage for every persistent id the pickle names."""
    views = {}

    def persistent_load(saved_id):
        assert isinstance(saved_id, tuple)
        typename = saved_id[0]
        if isinstance(typename, bytes):
            typename = typename.decode("ascii")
        if typename != "storage":
            raise pickle.UnpicklingError(f"unknown persistent id type {typename!r}")
        storage_type, key, location = saved_id[1], saved_id[2], saved_id[3]
        dtype = _storage_dtype(storage_type)
        untyped = storage_for_key(str(key), location, dtype)
        if legacy and len(saved_id) > 5 and saved_id[5] is not None:
            # Legacy files may name a view of a root storage: (view_key, offset, view_size).
            view_key, offset, view_size = saved_id[5]
            if view_key not in views:
                size = torch._utils._element_size(dtype)
                views[view_key] = untyped[offset * size : (offset + view_size) * size]
            return _typed(views[view_key], dtype)
        return _typed(untyped, dtype)

    if weights_only:
        from torch import _weights_only_unpickler

        unpickler = _weights_only_unpickler.Unpickler(io.BytesIO(data), encoding="utf-8")
    else:
        unpickler = _Unpickler(io.BytesIO(data), encoding="utf-8")
    unpickler.persistent_load = persistent_load
    result = unpickler.load()
    torch._utils._validate_loaded_sparse_tensors()
    return result
