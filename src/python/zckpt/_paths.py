"""The paths zckpt's Python layer takes: local files and folders, and objects and folders
(key prefixes) in S3-compatible storage, s3://BUCKET/KEY and s3://BUCKET/PREFIX/.

Containers themselves are opened by the C++ library, which reads either kind (ranged GETs for an
object); what the Python layer does itself with a path (list a folder, read DCP's .metadata or a
converted folder's index, write a small file whole) goes through these helpers, so every caller
gets both kinds. An object folder needs no creating; a small object written whole appears whole
(one PUT), as a local file written by rename does."""
import os

from . import _core

SCHEME = "s3://"


def is_url(path):
    return isinstance(path, str) and path.startswith(SCHEME)


def join(base, *names):
    if is_url(base):
        return "/".join([base.rstrip("/")] + [n.strip("/") for n in names])
    return os.path.join(base, *names)


def basename(path):
    return path.rstrip("/").rsplit("/", 1)[-1] if is_url(path) else os.path.basename(path)


def isdir(path):
    return _core.is_object_folder(path) if is_url(path) else os.path.isdir(path)


def isfile(path):
    if is_url(path):
        return not path.endswith("/") and _core.object_exists(path)
    return os.path.isfile(path)


def exists(path):
    return isfile(path) or isdir(path) if is_url(path) else os.path.exists(path)


def listdir(path):
    """Names in the folder, sorted; of an object folder, the first component of every key below
    it (so sub-folders are listed once, as os.listdir lists them)."""
    if not is_url(path):
        return sorted(os.listdir(path))
    return sorted({name.split("/", 1)[0] for name, _ in _core.list_objects(path)})


def files_under(path):
    """{relative name: size} of every file below the folder, at any depth ('/'-separated)."""
    if is_url(path):
        return dict(_core.list_objects(path))
    out = {}
    for root, _, files in os.walk(path):
        for f in files:
            full = os.path.join(root, f)
            out[os.path.relpath(full, path).replace(os.sep, "/")] = os.path.getsize(full)
    return out


def read_bytes(path, max_bytes=1 << 30):
    """The whole file or object. A local path must be a regular file (a FIFO or device is
    refused, never read: the C++ readers' rule)."""
    if is_url(path):
        return _core.read_object(path, max_bytes)
    return _core.read_regular_file(os.fspath(path))


def write_atomically(path, data):
    """The whole of `data` at `path`, or nothing changed: temporary, fsync, rename (local), one
    PUT (object)."""
    if is_url(path):
        _core.write_object(path, bytes(data))
    else:
        _core.write_file_atomically(os.fspath(path), bytes(data))


def makedirs(path):
    if not is_url(path):
        os.makedirs(path, exist_ok=True)
