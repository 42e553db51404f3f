"""torchtitan's checkpoints as zckpt DCP folders: `zckpt.torchtitan.use_zckpt()`, once per process,
before the trainer saves or resumes (torchtitan's CheckpointManager takes no storage setting).

From then on torchtitan's `CheckpointManager` (torchtitan 0.3.0 tested) goes on doing everything
it does (which states, which step folder `step-N`, sync or async save, the purge of old steps)
through torch.distributed.checkpoint, with zckpt as DCP's storage (zckpt/dcp.py):

- every save it makes by folder (`checkpoint_id`; not its HuggingFace exports, which bring their
  own storage writer) writes `ZckptStorageWriter(step folder)`: one `__<rank>_0.zckpt` container
  per rank plus DCP's `.metadata`, no `.distcp`;
- a load of a folder holding zckpt containers reads it with `ZckptStorageReader` (every chunk's
  XXH3 checked); a folder written by DCP's own FileSystemWriter (a save made before zckpt was
  plugged in) is read by DCP's own reader, unchanged;
- a zckpt error on any rank (a corrupt chunk: zckpt.CorruptError naming the file and the chunk)
  is raised as itself on every rank, instead of inside DCP's CheckpointException.
"""
__all__ = ["use_zckpt"]


class _DcpWithZckpt:
    """What torchtitan's checkpointer module sees as `torch.distributed.checkpoint`: DCP itself,
    except that a save or load by `checkpoint_id` without its own storage goes through zckpt's."""

    def __init__(self, real, writer_options):
        self._real = real
        self._writer_options = writer_options

    def __getattr__(self, name):
        return getattr(self._real, name)

    def _writer(self, kwargs):
        if kwargs.get("storage_writer") is None and kwargs.get("checkpoint_id") is not None:
            from .dcp import ZckptStorageWriter

            kwargs["storage_writer"] = ZckptStorageWriter(kwargs["checkpoint_id"], **self._writer_options)
        return kwargs

    def save(self, state_dict, **kwargs):
        return self._real.save(state_dict, **self._writer(kwargs))

    def async_save(self, state_dict, **kwargs):
        return self._real.async_save(state_dict, **self._writer(kwargs))

    def load(self, state_dict, **kwargs):
        from .dcp import ZckptStorageReader, is_zckpt_folder, zckpt_errors_unwrapped

        checkpoint_id = kwargs.get("checkpoint_id")
        if kwargs.get("storage_reader") is not None or checkpoint_id is None or not is_zckpt_folder(checkpoint_id):
            return self._real.load(state_dict, **kwargs)
        with zckpt_errors_unwrapped():
            return self._real.load(state_dict, **dict(kwargs, storage_reader=ZckptStorageReader(checkpoint_id)))


def use_zckpt(**writer_options):
    """Plugs zckpt into torchtitan's CheckpointManager for this process (idempotent; a later call's
    writer options replace the earlier ones). `writer_options` go to ZckptStorageWriter
    (chunk_bytes, zstd_level, threads). Returns the CheckpointManager class."""
    from torchtitan.components.checkpointer import dcp as module

    if isinstance(module.dcp, _DcpWithZckpt):
        module.dcp._writer_options = writer_options
    else:
        module.dcp = _DcpWithZckpt(module.dcp, writer_options)
    return module.CheckpointManager
