"""A checkpoint folder whose files are written in the background (a framework's async_save),
marked incomplete on disk until every one of them has landed, so that a folder left by a process
that died mid-write is never taken for a checkpoint.

The mark is a file `zckpt-incomplete.rank<R>` in the folder (one per rank that writes there),
made durable (fsync of the file and the folder) as soon as the folder's first write is handed to
the background, and removed once the folder is sealed (the framework has handed over all of it:
seal_all) and every write in it has landed (zckpt.save's fsync and rename). A write that fails, and a folder
whose save never finished, keep their marks; the error is raised by wait()."""
import concurrent.futures
import os
import threading

from . import _core
from ._errors import IncompleteCheckpointError

INCOMPLETE_MARK = "zckpt-incomplete"
_MARK_TEXT = (b"zckpt: an asynchronous save was still writing this checkpoint's files. While this file is "
              b"here, the folder is not a checkpoint: a resume from it refuses it.\n")


def incomplete_marks(folder):
    """The names of the incomplete marks in `folder` (empty for a complete or missing folder)."""
    try:
        return sorted(n for n in os.listdir(folder) if n.startswith(INCOMPLETE_MARK))
    except (FileNotFoundError, NotADirectoryError):
        return []


def refuse_incomplete(folder, instead=None):
    """IncompleteCheckpointError naming `folder` when it carries an incomplete mark, and
    `instead` (an earlier, complete checkpoint) as the one to resume from."""
    marks = incomplete_marks(folder)
    if not marks:
        return
    hint = f"resume from {instead}" if instead else "resume from an earlier checkpoint"
    err = IncompleteCheckpointError(
        f"{folder}: not a checkpoint: an asynchronous save was still writing its files when the process that "
        f"saved it stopped ({', '.join(marks)} is there); {hint}, or delete the folder")
    err.file = os.fspath(folder)
    raise err


def _mark_name():
    """This process's mark: zckpt-incomplete.rank<R>, R its rank (0 outside torch.distributed)."""
    import torch.distributed as dist

    rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else int(os.environ.get("RANK", "0"))
    return f"{INCOMPLETE_MARK}.rank{rank}"


def clear_stale_mark(folder):
    """Removes this process's mark from `folder`, which it has just written whole (synchronously):
    a mark left there by an earlier process that died writing the same folder."""
    try:
        _unmark(folder, _mark_name())
    except FileNotFoundError:
        pass


def _mark(folder, name):
    """The mark, durable when this returns: the core's atomic write (temporary, fsync, rename,
    fsync of the folder)."""
    _core.write_file_atomically(os.path.join(folder, name), _MARK_TEXT)


def _unmark(folder, name):
    """The mark removed, and the removal made durable (fsync of the folder)."""
    os.remove(os.path.join(folder, name))
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class _Folder:
    def __init__(self):
        self.writes = []  # (path, Future) of each file handed over
        self.sealed = False


class FolderWrites:
    """Files of checkpoint folders written in the background by zckpt.AsyncSaver, one saver per
    file name (its snapshot buffer kept for the next checkpoint's file of that name), with the
    folder's incomplete mark as above."""

    def __init__(self):
        self._lock = threading.Lock()
        self._savers = {}  # file name -> AsyncSaver
        self._folders = {}  # folder -> _Folder, until its mark is gone or known to stay
        self._errors = []  # what failed, for wait() to raise

    def save(self, obj, path, **options):
        """Snapshots `obj` and writes it to `path` in the background (zckpt.AsyncSaver.save's
        options and errors: an object zckpt.save refuses is refused here, nothing marked)."""
        from ._save import AsyncSaver

        path = os.path.abspath(os.fspath(path))
        folder = os.path.dirname(path)
        with self._lock:
            saver = self._savers.setdefault(os.path.basename(path), AsyncSaver())
        future = saver.save(obj, path, **options)
        with self._lock:
            entry = self._folders.get(folder)
            if entry is None:
                _mark(folder, _mark_name())
                entry = self._folders[folder] = _Folder()
            entry.writes.append((path, future))
        future.add_done_callback(lambda _: self._landed(folder))
        return future

    def seal_all(self):
        """Everything of every folder handed over so far is: each one's mark goes once its writes
        have landed."""
        with self._lock:
            for entry in self._folders.values():
                entry.sealed = True
            folders = list(self._folders)
        for folder in folders:
            self._landed(folder)

    def writing(self, folder):
        """Whether `folder` has writes handed over whose mark is still to go."""
        with self._lock:
            return os.path.abspath(os.fspath(folder)) in self._folders

    def wait(self):
        """Waits for every write in flight; raises the first error among them (a ZckptError naming
        the file) after all have ended. Folders never sealed keep their marks."""
        with self._lock:
            folders = list(self._folders)
            futures = [future for entry in self._folders.values() for _, future in entry.writes]
        concurrent.futures.wait(futures)
        for folder in folders:
            self._landed(folder)
        with self._lock:
            for folder in folders:
                self._folders.pop(folder, None)  # unsealed: its mark stays
            errors, self._errors = self._errors, []
        if errors:
            raise errors[0]

    def close(self):
        """wait(), then frees every saver's snapshot buffer."""
        try:
            self.wait()
        finally:
            with self._lock:
                savers, self._savers = list(self._savers.values()), {}
            for saver in savers:
                saver.close()

    def _landed(self, folder):
        """Removes `folder`'s mark once it is sealed and all its writes have succeeded; records the
        errors of those that failed (the mark stays)."""
        with self._lock:
            entry = self._folders.get(folder)
            if entry is None or not entry.sealed or not all(f.done() for _, f in entry.writes):
                return
            del self._folders[folder]
            failed = [f.exception() for _, f in entry.writes if f.exception() is not None]
            if failed:
                self._errors.extend(failed)
                return
            try:
                _unmark(folder, _mark_name())
            except OSError as e:
                self._errors.append(e)
