"""Lightning's checkpoints as zckpt containers: `Trainer(plugins=[zckpt.lightning.ZckptCheckpointIO()])`.

ZckptCheckpointIO is Lightning's CheckpointIO for both of its packages (`lightning` and
`pytorch_lightning`, whichever are installed: `pip install zckpt[lightning]`). Every checkpoint
the Trainer writes through its strategy's CheckpointIO (ModelCheckpoint's top-k and last,
`trainer.save_checkpoint`) is a container at the path Lightning chose (`epoch=0-step=8.ckpt`),
written atomically, every chunk checksummed; `ckpt_path=...` and `"last"` read it back through
zckpt.load, so a damaged file raises zckpt.CorruptError naming the file and chunk before anything
is restored. A `.ckpt` written by torch.save (Lightning's default I/O) is read by torch.load as
before. With async_save=True the training step waits only for the snapshot (zckpt.AsyncSaver):
the write goes on in a background thread; a failed write is raised by the next save, load,
remove or teardown. Strategies that write checkpoints without their CheckpointIO are not covered
(docs/integrations.md names them).
"""
import os

from ._framework_io import load_file


def _checkpoint_io_bases():
    """Lightning's CheckpointIO classes, one per installed package; ImportError naming the extra
    when neither is."""
    bases = []
    try:
        from lightning.fabric.plugins.io.checkpoint_io import CheckpointIO

        bases.append(CheckpointIO)
    except ImportError:
        pass
    try:
        from lightning_fabric.plugins.io.checkpoint_io import CheckpointIO as StandaloneCheckpointIO

        if StandaloneCheckpointIO not in bases:
            bases.append(StandaloneCheckpointIO)
    except ImportError:
        pass
    if not bases:
        raise ImportError("zckpt.lightning needs Lightning (`lightning` or `pytorch_lightning`): "
                          "pip install zckpt[lightning]")
    return tuple(bases)


class ZckptCheckpointIO(*_checkpoint_io_bases()):
    """Lightning's CheckpointIO writing and reading zckpt containers (see the module's docstring)."""

    def __init__(self, async_save=False):
        super().__init__()
        self.async_save = async_save
        self._saver = None  # the AsyncSaver of async_save=True, made on the first save
        self._pending = None  # (path, Future) of the write in flight

    def save_checkpoint(self, checkpoint, path, storage_options=None):
        """Writes `checkpoint` as a container at `path` (its folder made first); with async_save,
        returns once the snapshot is taken."""
        if storage_options is not None:
            raise TypeError(f"{type(self).__name__} takes no storage_options (got {storage_options!r})")
        path = os.fspath(path)
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        self._finish_pending()
        if not self.async_save:
            from ._save import save

            save(checkpoint, path)
            return
        if self._saver is None:
            from ._save import AsyncSaver

            self._saver = AsyncSaver()
        self._pending = (path, self._saver.save(checkpoint, path))

    def load_checkpoint(self, path, map_location=lambda storage, loc: storage, weights_only=None):
        """The checkpoint at `path`, as TorchCheckpointIO.load_checkpoint gives it: a container
        through zckpt.load (chunks checked), a torch.save file through torch.load."""
        self._finish_pending()
        # A link (ModelCheckpoint's last.ckpt) is read as the file it names, so that an error names
        # the damaged file itself.
        path = os.path.realpath(os.fspath(path))
        if not os.path.exists(path):
            raise FileNotFoundError(f"Checkpoint file not found: {path}")
        return load_file(path, map_location=map_location, weights_only=weights_only)

    def remove_checkpoint(self, path):
        """Removes the checkpoint at `path` (a folder recursively), once any write in flight ended."""
        path = os.fspath(path)
        self._finish_pending()
        if os.path.islink(path) or os.path.isfile(path):
            os.remove(path)
        elif os.path.isdir(path):
            import shutil

            shutil.rmtree(path)

    def teardown(self):
        """Waits for the write in flight (raising its error) and frees the snapshot buffer."""
        try:
            self._finish_pending()
        finally:
            if self._saver is not None:
                self._saver.close()
                self._saver = None

    def _finish_pending(self):
        """Waits for the write in flight; its error (a ZckptError naming the file) is raised here."""
        if self._pending is None:
            return
        _, future = self._pending
        self._pending = None
        future.result()
