"""zckpt's error classes, defined by the torch-free `_core` and raised by both extension modules.
Each carries, as attributes, where the error lies: file, storage, tensors, chunk, file_bytes and
storage_bytes (None for what it is not about)."""
from ._core import CorruptError, UnsafeError, ZckptError  # noqa: F401
