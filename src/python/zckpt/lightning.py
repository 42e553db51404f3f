"""Lightning's checkpoints as zckpt containers: `Trainer(plugins=[zckpt.lightning.ZckptCheckpointIO()])`.

ZckptCheckpointIO is Lightning's CheckpointIO for both of its packages (`lightning` and
`pytorch_lightning`, whichever are installed: `pip install zckpt[lightning]`). Every checkpoint
the Trainer writes through its strategy's CheckpointIO (ModelCheckpoint's top-k and last,
`trainer.save_checkpoint`) is a container at the path Lightning chose (`epoch=0-step=8.ckpt`),
written atomically, every chunk checksummed; `ckpt_path=...` and `"last"` read it back through
zckpt.load, so a damaged file raises zckpt.CorruptError naming the file and chunk before anything
is restored. A `.ckpt` written by torch.save (Lightning's default I/O) is read by torch.load as
before. With async_save=True the training step waits only for the snapshot (zckpt.AsyncSaver):
the write goes on in a background thread; a failed write is raised by the next save, load or
teardown, and a removal asked for meanwhile (ModelCheckpoint's) is done once the write has ended,
never if it failed.

FSDPStrategy(state_dict_type="sharded") and ModelParallelStrategy(save_distributed_checkpoint=True)
write their sharded checkpoint folders without the CheckpointIO; with a ZckptCheckpointIO plugged
in, constructing it wraps their save_checkpoint, load_checkpoint and teardown (on the class, once,
in both packages) so that such a folder is a zckpt DCP folder: a container per rank (zckpt.dcp's
ZckptStorageWriter) plus DCP's `.metadata`, and Lightning's meta.pt a container too, written last.
With async_save=True the sharded save returns once the shards are copied to host memory:
torch.distributed.checkpoint.async_save writes the folder in a background thread, its collectives
on a gloo group of their own; as for one file, the next save, load and teardown wait for it
(removals held until then) and raise its error (a ZckptError naming the file, on every rank). It
is refused while a logger uploads each checkpoint as it is saved (log_model="all"), which would
read a folder still being written. Resuming from a folder reads the shards through ZckptStorageReader into the live model
and optimizers and meta.pt through zckpt.load; a corrupt chunk on any rank raises
zckpt.CorruptError on every rank. Their full
(one-file) checkpoints are containers written through the CheckpointIO, loaded by Lightning's own
method with its reads of the file routed to zckpt.load. A folder of DCP's own `.distcp` files, a
torch.save file, and strategies without a ZckptCheckpointIO go to Lightning's methods unchanged.
Other strategies that bypass the CheckpointIO (DeepSpeed) are not covered (docs/integrations.md
names them).
"""
import contextlib
import functools
import importlib
import os
from pathlib import Path

from ._framework_io import _Swap, is_container, load_file, torch_io_through_zckpt

# Lightning's packages, each with its own copy of the strategies below (whichever are installed).
_PACKAGES = ("lightning.pytorch", "pytorch_lightning")


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


def _remove(path):
    """Removes the file, link or folder (recursively) at `path`, if any."""
    if os.path.islink(path) or os.path.isfile(path):
        os.remove(path)
    elif os.path.isdir(path):
        import shutil

        shutil.rmtree(path)


class ZckptCheckpointIO(*_checkpoint_io_bases()):
    """Lightning's CheckpointIO writing and reading zckpt containers (see the module's docstring)."""

    def __init__(self, async_save=False):
        super().__init__()
        _install_sharded_io()
        self.async_save = async_save
        self._saver = None  # the AsyncSaver of async_save=True, made on the first save
        self._pending = None  # (path, wait) of the write in flight: wait() returns once it ended, or raises its error
        self._removals = []  # paths remove_checkpoint was given while that write was in flight
        self._write_group = None  # (the default group it was made under, _sharded_write_group's group)

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
        self._pending = (path, self._saver.save(checkpoint, path).result)

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
        """Removes the checkpoint at `path` (a folder recursively) once the write in flight, if
        any, has ended, without making the step wait for it: ModelCheckpoint removes the checkpoint
        a new one replaces right after saving the new one, so the old one is removed when the new
        one is whole (by the next save, load or teardown, which wait for the write first) and not
        at all if its write failed. The checkpoint being written itself is removed at once, after
        its write."""
        path = os.fspath(path)
        if self._pending is not None and os.path.realpath(path) != os.path.realpath(self._pending[0]):
            self._removals.append(path)
            return
        self._finish_pending()
        _remove(path)

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
        (_, wait), self._pending = self._pending, None
        removals, self._removals = self._removals, []
        wait()  # a failed write keeps the checkpoints it was to replace
        for path in removals:
            _remove(path)

    def _sharded_write_group(self):
        """The gloo group that background sharded writes run their collectives on, made by the first
        one (a collective: every rank makes its sharded save together) and again after the default
        group is replaced. Collectives on one group must come in the same order on every rank; the
        training step's, on the strategy's group, run meanwhile in another thread, so the writes
        get a group of their own. gloo: DCP's async_save needs a group with a CPU backend."""
        import torch.distributed as dist

        world = dist.group.WORLD
        if self._write_group is None or self._write_group[0] is not world:
            self._write_group = (world, dist.new_group(backend="gloo"))
        return self._write_group[1]


# ----- sharded checkpoints: FSDPStrategy and ModelParallelStrategy --------------------------------
#
# These two write a sharded checkpoint without their CheckpointIO: a folder where DCP writes the
# model's and optimizers' shards by folder name (FileSystemWriter's `.distcp`) and rank 0 writes
# the rest with torch.save to `meta.pt`; their load reads it back with DCP's FileSystemReader and
# torch.load. So their save_checkpoint and load_checkpoint are wrapped, on the class, to do the
# same steps with ZckptStorageWriter / ZckptStorageReader and zckpt.save / zckpt.load, but only
# for a strategy whose checkpoint_io is a ZckptCheckpointIO, and for the load only of a folder
# zckpt wrote: any other strategy, one-file checkpoint or `.distcp` folder goes to Lightning's own
# method unchanged. torch itself is not patched. Their teardown is wrapped too: it does not call
# the CheckpointIO's teardown (Strategy.teardown does), which waits for the write in flight.
#
# With async_save=True a sharded save is one DCP async_save. Lightning's places that touch the
# folder afterwards: ModelCheckpoint's removals (Strategy.remove_checkpoint -> the CheckpointIO's
# remove_checkpoint on rank 0), its last.ckpt link (made at once; it names the folder, reads
# nothing), the next save, a load, teardown, and loggers' after_save_checkpoint (uploads with
# log_model): each waits for the write, is held until it has ended (removals), or is refused
# (_refuse_uploads_at_save).


class _ShardedLayout:
    """One strategy's sharded checkpoint: where it lives in a package, when its save is sharded,
    the key of the model's shards, and how the shards are loaded into the live model and
    optimizers."""

    def __init__(self, module, name, is_sharded, model_key, load_shards):
        self.module = module  # under the package: lightning.pytorch.<module>
        self.name = name
        self.is_sharded = is_sharded  # strategy -> whether its save_checkpoint writes a folder
        self.model_key = model_key
        self.load_shards = load_shards  # (strategy, its module, folder) -> None


def _load_fsdp_shards(strategy, module, path):
    """FSDPStrategy.load_checkpoint's sharded branch, reading through ZckptStorageReader."""
    from torch.distributed.checkpoint.optimizer import load_sharded_optimizer_state_dict
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    from .dcp import ZckptStorageReader, zckpt_errors_unwrapped

    with module._get_sharded_state_dict_context(strategy.model):
        model_state = {"model": strategy.model.state_dict()}
        _dcp_load(model_state, path)
        strategy.model.load_state_dict(model_state["model"], strict=strategy.lightning_module.strict_loading)
        if strategy.lightning_module.trainer.state.fn != module.TrainerFn.FITTING:
            return
        for idx, optimizer in enumerate(strategy.optimizers):
            key = f"optimizer_{idx}"
            with zckpt_errors_unwrapped():
                state = load_sharded_optimizer_state_dict(model_state_dict=model_state["model"], optimizer_key=key,
                                                          storage_reader=ZckptStorageReader(path))
            optimizer.load_state_dict(FSDP.optim_state_dict_to_load(optim_state_dict=state[key], model=strategy.model,
                                                                    optim=optimizer))


def _load_model_parallel_shards(strategy, module, path):
    """ModelParallelStrategy.load_checkpoint's sharded branch (Lightning's fabric
    _load_checkpoint), reading through ZckptStorageReader."""
    from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                           get_optimizer_state_dict, set_optimizer_state_dict)

    model = strategy.model
    model_state = {"state_dict": get_model_state_dict(model)}
    _dcp_load(model_state, path)
    model.load_state_dict(model_state["state_dict"], strict=strategy.lightning_module.strict_loading)
    for idx, optimizer in enumerate(strategy.optimizers):
        key = f"optimizer_{idx}"
        state = {key: get_optimizer_state_dict(model, optimizer)}
        _dcp_load(state, path)
        set_optimizer_state_dict(model, optimizer, optim_state_dict=state[key],
                                 options=StateDictOptions(cpu_offload=True))


_SHARDED_LAYOUTS = (
    _ShardedLayout("strategies.fsdp", "FSDPStrategy", lambda s: s._state_dict_type == "sharded", "model",
                   _load_fsdp_shards),
    _ShardedLayout("strategies.model_parallel", "ModelParallelStrategy", lambda s: s._save_distributed_checkpoint,
                   "state_dict", _load_model_parallel_shards),
)


def _dcp_save(state, path):
    import torch.distributed.checkpoint as dcp

    from .dcp import ZckptStorageWriter, zckpt_errors_unwrapped

    with zckpt_errors_unwrapped():
        dcp.save(state, storage_writer=ZckptStorageWriter(path))


def _dcp_load(state, path):
    import torch.distributed.checkpoint as dcp

    from .dcp import ZckptStorageReader, zckpt_errors_unwrapped

    with zckpt_errors_unwrapped():
        dcp.load(state, storage_reader=ZckptStorageReader(path))


def _sharded_folder(strategy, layout, checkpoint, filepath):
    """(folder, shards) of a sharded save, as Lightning's save makes them: rank 0's `filepath` as a
    folder (a file there removed), and the model's and optimizers' states taken out of
    `checkpoint`, whose rest goes to meta.pt."""
    path = Path(strategy.broadcast(filepath))
    if path.is_file():
        path.unlink()
    path.mkdir(parents=True, exist_ok=True)
    shards = {layout.model_key: checkpoint.pop("state_dict")}
    shards.update({f"optimizer_{idx}": state for idx, state in enumerate(checkpoint.pop("optimizer_states", []))})
    return path, shards


def _save_sharded(strategy, layout, module, checkpoint, filepath):
    """The strategy's sharded save: the model's and optimizers' shards as a zckpt DCP folder (a
    container per rank, `.metadata` last), the rest as a container at meta.pt (rank 0)."""
    from ._save import save

    path, shards = _sharded_folder(strategy, layout, checkpoint, filepath)
    _dcp_save(shards, str(path))
    if strategy.global_rank == 0:
        save(checkpoint, str(path / module._METADATA_FILENAME))


def _save_sharded_in_background(strategy, layout, module, checkpoint, filepath):
    """The sharded save of async_save=True: the folder _save_sharded writes, returning once the
    shards are copied to host memory and rank 0 has a deep copy of the rest. DCP's async_save
    writes the containers, `.metadata`, then meta.pt (_meta_last_writer) in a background thread;
    the checkpoint_io keeps that write as the one in flight, which every later save, load,
    remove and teardown waits for first. The copy is DCP's BlockingAsyncStager (a new CPU tensor
    for each tensor, ShardedTensor shard and DTensor local tensor): async_save's default stager
    stops at FSDP1's ShardedTensor ("data_ptr ... not supported for ShardedTensor")."""
    import copy

    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.staging import BlockingAsyncStager

    io = strategy.checkpoint_io
    io._finish_pending()
    _refuse_uploads_at_save(strategy)
    group = io._sharded_write_group()
    path, shards = _sharded_folder(strategy, layout, checkpoint, filepath)
    meta = path / module._METADATA_FILENAME
    rest = None
    if strategy.global_rank == 0:  # DCP's coordinator: rank 0 of `group`, which holds every rank in order
        _unmark_whole(path, meta)
        rest = copy.deepcopy(checkpoint)
    writer = _meta_last_writer()(str(path), str(meta), rest)
    future = dcp.async_save(shards, storage_writer=writer, process_group=group, async_stager=BlockingAsyncStager())
    io._pending = (str(path), functools.partial(_dcp_result, future))


def _unmark_whole(path, meta):
    """Removes the marks of a whole checkpoint from a folder about to be written again (a save to
    the path of an earlier one: save_last=True's last.ckpt): its meta.pt, which the load requires,
    and DCP's `.metadata`, so that until the new write ends the folder is refused rather than
    read as old metadata over new containers."""
    from .dcp import METADATA_NAME

    for mark in (meta, path / METADATA_NAME):
        mark.unlink(missing_ok=True)


@functools.cache
def _meta_last_writer():
    """ZckptStorageWriter(path) that also writes the checkpoint's rest as the container meta.pt,
    in finish (DCP's coordinator, once every rank's container is written) after `.metadata`: the
    synchronous save's order, so that a folder with meta.pt is whole; a failure there reaches
    every rank through DCP, as a failed container does. A class made on first use: zckpt.dcp
    imports torch.distributed.checkpoint."""
    from ._save import save
    from .dcp import ZckptStorageWriter

    class MetaLastWriter(ZckptStorageWriter):
        def __init__(self, path, meta_path, rest):
            super().__init__(path)
            self.meta_path = meta_path
            self.rest = rest  # None off the coordinator

        def finish(self, metadata, results):
            super().finish(metadata, results)
            save(self.rest, self.meta_path)

    return MetaLastWriter


def _dcp_result(future):
    """Waits for DCP's background save `future`; a ZckptError of any rank (the lowest one's) is
    raised as itself, as _dcp_save raises it."""
    from .dcp import zckpt_errors_unwrapped

    with zckpt_errors_unwrapped():
        future.result()


def _refuse_uploads_at_save(strategy):
    """Raises when a logger of the strategy's Trainer reads each checkpoint right after its save:
    it would read a folder still being written. Lightning's WandbLogger, MLFlowLogger and
    LitLogger upload checkpoints then with log_model="all", or with log_model=True while a
    ModelCheckpoint keeps every checkpoint (save_top_k=-1); log_model=True otherwise uploads them
    at the end of fit, after teardown has waited for the write."""
    module = strategy.lightning_module
    trainer = getattr(module, "_trainer", None)
    if trainer is None:
        return
    keeps_every_checkpoint = any(c.save_top_k == -1 for c in trainer.checkpoint_callbacks)
    for logger in trainer.loggers:
        log_model = getattr(logger, "_log_model", False)
        if log_model == "all" or (log_model and keeps_every_checkpoint):
            raise RuntimeError(
                f"ZckptCheckpointIO(async_save=True) cannot write {type(strategy).__name__}'s sharded checkpoints "
                f"in the background: {type(logger).__name__}(log_model={log_model!r}) uploads each checkpoint "
                f"as soon as it is saved, which would upload a folder still being written. Use async_save=False, "
                f"or log_model=True with a ModelCheckpoint that keeps the top k (uploaded at the end of fit)")


def _save_hook(original, layout, module):
    @functools.wraps(original)
    def save_checkpoint(self, checkpoint, filepath, storage_options=None):
        if not (isinstance(self.checkpoint_io, ZckptCheckpointIO) and layout.is_sharded(self)):
            return original(self, checkpoint, filepath, storage_options)
        if storage_options is not None:
            raise TypeError(f"{type(self).__name__}.save_checkpoint takes no storage_options "
                            f"(got {storage_options!r})")
        if self.checkpoint_io.async_save:
            _save_sharded_in_background(self, layout, module, checkpoint, filepath)
        else:
            _save_sharded(self, layout, module, checkpoint, filepath)

    return save_checkpoint


def _load_hook(original, layout, module):
    lazy_load_reads_containers = _lazy_load_swap(module)

    @functools.wraps(original)
    def load_checkpoint(self, checkpoint_path, weights_only=None):
        from .dcp import is_zckpt_folder

        if not isinstance(self.checkpoint_io, ZckptCheckpointIO):
            return original(self, checkpoint_path, weights_only)
        self.checkpoint_io._finish_pending()  # a folder is read only once its write ended
        # Rank 0's path on every rank (as Lightning does); a link (ModelCheckpoint's last.ckpt)
        # is read as the folder it names, so that an error names the damaged file itself.
        path = Path(os.path.realpath(self.broadcast(os.fspath(checkpoint_path))))
        if is_container(path):
            # A full (one-file) checkpoint, written through ZckptCheckpointIO: Lightning's own
            # load, its reads of the file routed to zckpt.load.
            with torch_io_through_zckpt(), lazy_load_reads_containers():
                return original(self, path, weights_only)
        meta = path / module._METADATA_FILENAME
        if not (meta.is_file() and is_zckpt_folder(path)):
            return original(self, path, weights_only)
        layout.load_shards(self, module, str(path))
        return load_file(str(meta), weights_only=weights_only)

    return load_checkpoint


def _teardown_hook(original):
    """teardown that ends with the checkpoint_io's teardown, as Strategy.teardown does: these two
    strategies' own teardown does not call it, so the write in flight would go unwaited (and its
    error unraised) when fit ends. Lightning's teardown runs either way."""
    @functools.wraps(original)
    def teardown(self):
        if not isinstance(self.checkpoint_io, ZckptCheckpointIO):
            return original(self)
        try:
            self.checkpoint_io.teardown()
        finally:
            original(self)

    return teardown


def _lazy_load_swap(module):
    """The block in which `module`'s _lazy_load (FSDPStrategy's read of a full checkpoint; it opens
    the file as torch.save's zip) reads a container through zckpt.load and any other file as
    Lightning's _lazy_load does (_Swap: every thread, blocks nest); a block that does nothing for
    a module without one (ModelParallelStrategy's torch.load(mmap=True) is routed by
    torch_io_through_zckpt instead)."""
    if not hasattr(module, "_lazy_load"):
        return contextlib.nullcontext

    def reading_containers(original):
        lazy_load = original["_lazy_load"]
        return {"_lazy_load": lambda f: load_file(os.fspath(f)) if is_container(f) else lazy_load(f)}

    return _Swap(module.__name__, ("_lazy_load",), reading_containers).block


def _install_sharded_io():
    """Wraps save_checkpoint, load_checkpoint and teardown of FSDPStrategy and
    ModelParallelStrategy in every installed Lightning package (once; a class wrapped already is
    left)."""
    for package in _PACKAGES:
        for layout in _SHARDED_LAYOUTS:
            try:
                module = importlib.import_module(f"{package}.{layout.module}")
            except ImportError:
                continue
            cls = getattr(module, layout.name)
            if getattr(cls.save_checkpoint, "_zckpt_sharded", False):
                continue
            cls.save_checkpoint = _save_hook(cls.save_checkpoint, layout, module)
            cls.load_checkpoint = _load_hook(cls.load_checkpoint, layout, module)
            cls.teardown = _teardown_hook(cls.teardown)
            cls.save_checkpoint._zckpt_sharded = True
