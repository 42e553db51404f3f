"""The Hugging Face Trainer's checkpoints through zckpt: `trainer = zckpt.transformers.use_zckpt(trainer)`.

Takes any transformers.Trainer (subclasses too: TRL's trainers, the user's own) and returns it,
changed in place: from then on, every file its checkpoint code writes with torch.save
(optimizer.pt, scheduler.pt, scaler.pt, rng_state.pth or rng_state_R.pth per rank,
training_args.bin, and whatever a subclass saves the same way) is a container, written atomically
with every chunk checksummed, and `trainer.train(resume_from_checkpoint=...)` reads them back
through zckpt.load, in place as before: a damaged file raises zckpt.CorruptError naming the file
and chunk before a step runs. A checkpoint folder written before zckpt was plugged in (torch.save
files) resumes too. The model's weights stay what the Trainer writes (model.safetensors, or
pytorch_model.bin as a container when save_safetensors=False), so `from_pretrained` on a
`checkpoint-N` folder reads them as always; trainer_state.json and the config stay JSON.
Under FSDP, the Trainer saves and loads through accelerate's FSDP checkpoint functions: their
SHARDED_STATE_DICT folders (pytorch_model_fsdp_0/, optimizer_0/) are written with zckpt.dcp's
storage and read back checked, as under zckpt.accelerate.use_zckpt (its fsdp_io).

With async_save=True the training loop waits only for a snapshot of what a checkpoint's torch.save
files hold (a host copy; optimizer.pt's is most of it); the containers are written in the
background (zckpt.AsyncSaver, one per file name, its buffer kept between checkpoints). The Trainer
takes a folder holding trainer_state.json for a checkpoint, and resumes from one whose
optimizer.pt is missing without a word; so the folder carries a `zckpt-incomplete.rank<R>` mark
(_folder_writes.py) from its first background write until all have landed, and the Trainer's
deletion of old checkpoints (save_total_limit) waits until then: the newest complete checkpoint
is never deleted for one still being written. The next checkpoint, and the end of train(), wait
for the writes and raise their error. Under either setting, resume_from_checkpoint=True takes the
newest complete checkpoint (a warning names each marked folder passed over), and a marked folder
named explicitly raises zckpt.IncompleteCheckpointError.
`pip install zckpt[transformers]`. What is not covered: docs/integrations.md.
"""
import functools
import os
import re
import threading
import warnings

from ._folder_writes import FolderWrites, clear_stale_mark, incomplete_marks, refuse_incomplete
from ._framework_io import _Swap, checkpoint_io_through_zckpt, holding, saves_in_background, wrap_methods

# The Trainer's methods under which torch.save writes containers and torch.load reads them, and DCP's
# file-system storage is zckpt's: train (the resume: _load_from_checkpoint, _load_optimizer_and_scheduler,
# _load_scaler, _load_rng_state, and every checkpoint saved while training), _save_checkpoint (one
# checkpoint folder) and save_model (training_args.bin; under FSDP the model's folder).
_WRAPPED = ("train", "_save_checkpoint", "save_model")


def use_zckpt(trainer, async_save=False):
    """Makes `trainer` (a transformers.Trainer, or a subclass's instance) write and resume its
    checkpoints through zckpt, in the background with async_save=True (see the module's
    docstring); returns it. Calling it again is harmless (async_save=True then turns the
    background writes on)."""
    try:
        from transformers import Trainer
    except ImportError as e:
        raise ImportError(f"zckpt.transformers needs transformers ({e}): pip install zckpt[transformers]") from e
    if not isinstance(trainer, Trainer):
        raise TypeError(f"use_zckpt takes a transformers.Trainer, not {type(trainer).__name__}")
    wrap_methods(trainer, _WRAPPED, through=checkpoint_io_through_zckpt)
    if not getattr(trainer.train, "_zckpt_resume_checked", False):
        trainer.train = _resuming_complete_checkpoints(trainer, trainer.train)
        trainer._save_checkpoint = _clearing_stale_marks(trainer, trainer._save_checkpoint)
    if async_save and getattr(trainer, "_zckpt_writes", None) is None:
        import transformers.trainer

        missing = [n for n in _ROTATION.names if not hasattr(transformers.trainer, n)]
        if missing:
            raise NotImplementedError(
                f"zckpt.transformers.use_zckpt(async_save=True) needs the Trainer to delete old checkpoints through "
                f"transformers.trainer's {' and '.join(missing)} (transformers 5.x), to hold those deletions until the "
                f"background writes have landed; transformers {transformers.__version__} does not. "
                f"Use async_save=False")
        trainer._zckpt_writes = _TrainerWrites()
        trainer._save_checkpoint = trainer._zckpt_writes.saving(trainer._save_checkpoint)
        trainer.train = trainer._zckpt_writes.training(trainer.train)
    return trainer


def _checkpoints(output_dir):
    """The checkpoint-N folders in output_dir, newest (largest N) first, as the Trainer names them."""
    from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

    pattern = re.compile(rf"^{re.escape(PREFIX_CHECKPOINT_DIR)}-(\d+)$")
    try:
        names = os.listdir(output_dir)
    except FileNotFoundError:
        return []
    found = [(int(m.group(1)), n) for n in names
             if (m := pattern.match(n)) and os.path.isdir(os.path.join(output_dir, n))]
    return [os.path.join(output_dir, n) for _, n in sorted(found, reverse=True)]


def _complete_checkpoint(trainer, resume_from_checkpoint):
    """What train() resumes from: for True, the newest checkpoint of output_dir that is complete
    (a warning names each incomplete one passed over; IncompleteCheckpointError when there are
    only incomplete ones); a folder named explicitly, unless it is incomplete (raised)."""
    if resume_from_checkpoint is True:
        found = _checkpoints(trainer.args.output_dir)
        complete = [c for c in found if not incomplete_marks(c)]
        for skipped in found[:found.index(complete[0])] if complete else []:
            warnings.warn(f"{skipped}: passed over for {complete[0]}: an asynchronous save was still writing it "
                          f"when its process stopped ({', '.join(incomplete_marks(skipped))})", stacklevel=3)
        if complete:
            return complete[0]
        if found:
            refuse_incomplete(found[0])
        return resume_from_checkpoint  # none at all: the Trainer's own error
    if isinstance(resume_from_checkpoint, (str, os.PathLike)):
        refuse_incomplete(resume_from_checkpoint)
    return resume_from_checkpoint


def _checkpoint_folder(trainer, args, kwargs):
    """The folder _save_checkpoint(model, trial) writes, named as it names it."""
    from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

    trial = args[1] if len(args) > 1 else kwargs.get("trial")
    return os.path.join(trainer._get_output_dir(trial=trial), f"{PREFIX_CHECKPOINT_DIR}-{trainer.state.global_step}")


def _clearing_stale_marks(trainer, save_checkpoint):
    """_save_checkpoint, then this rank's incomplete mark taken off the folder it wrote, unless
    background writes of it are still in flight (they take it off when they land): a mark left by
    an earlier process that died writing the same folder would make the whole new one refused."""

    @functools.wraps(save_checkpoint)
    def saving(*args, **kwargs):
        folder = _checkpoint_folder(trainer, args, kwargs)
        result = save_checkpoint(*args, **kwargs)
        writes = getattr(trainer, "_zckpt_writes", None)
        if writes is None or not writes.writing(folder):
            clear_stale_mark(folder)
        return result

    return saving


def _resuming_complete_checkpoints(trainer, train):
    """train with its resume_from_checkpoint (first positional argument or keyword) resolved by
    _complete_checkpoint."""

    @functools.wraps(train)
    def resuming(*args, **kwargs):
        if args:
            args = (_complete_checkpoint(trainer, args[0]), *args[1:])
        elif "resume_from_checkpoint" in kwargs:
            kwargs["resume_from_checkpoint"] = _complete_checkpoint(trainer, kwargs["resume_from_checkpoint"])
        return train(*args, **kwargs)

    resuming._zckpt_resume_checked = True
    return resuming


class _TrainerWrites:
    """A Trainer's async_save: the FolderWrites its checkpoints' torch.save files go to, and the
    deletions of old checkpoints deferred until those have landed."""

    def __init__(self):
        self._writes = FolderWrites()
        self._rotations = []  # rotate_checkpoints calls deferred until finish()

    def writing(self, folder):
        return self._writes.writing(folder)

    def saving(self, save_checkpoint):
        """_save_checkpoint, once the previous checkpoint's writes have finished, with torch.save
        writing in the background; the folder is sealed when it returns (not when it raises: the
        mark stays, as the checkpoint is not whole)."""

        @functools.wraps(save_checkpoint)
        def saving_in_background(*args, **kwargs):
            with _ROTATION.block(), self._active():
                self.finish()
                with saves_in_background(self._writes):
                    result = save_checkpoint(*args, **kwargs)
                self._writes.seal_all()
                return result

        return saving_in_background

    def training(self, train):
        """train, its checkpoints' writes and deferred deletions finished before it returns, and
        the snapshot buffers freed (the next train() makes them again)."""

        @functools.wraps(train)
        def training_then_finishing(*args, **kwargs):
            with _ROTATION.block(), self._active():
                try:
                    result = train(*args, **kwargs)
                except BaseException:
                    self._quiet_close()
                    raise
                self.finish()
                self._writes.close()
                return result

        return training_then_finishing

    def defer(self, rotate):
        self._rotations.append(rotate)

    def finish(self):
        """Waits for the writes in flight (raising their error); then, once every rank has (a
        barrier), runs the deletions deferred meanwhile: the checkpoint they keep is whole."""
        self._writes.wait()
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            dist.barrier()
        rotations, self._rotations = self._rotations, []
        for rotate in rotations:
            rotate()

    def _quiet_close(self):
        """The writes' end, on the way out of a train() that raised: its error is the one raised."""
        try:
            self._writes.close()
        except Exception as e:  # noqa: BLE001 (reported, not raised over the first error)
            warnings.warn(f"zckpt: a checkpoint write failed too: {e}", stacklevel=3)

    def _active(self):
        return holding(_THREAD, self)


# .value: the _TrainerWrites of the train() or _save_checkpoint running in this thread, or None.
_THREAD = threading.local()


def _deferring_deletions(original):
    """What _ROTATION sets in transformers.trainer: rotate_checkpoints deferred, and
    sort_checkpoints after the writes have finished, where a _TrainerWrites is active in the
    thread; as they were for every other caller."""
    rotate, sort = original["rotate_checkpoints"], original["sort_checkpoints"]

    @functools.wraps(rotate)
    def rotate_checkpoints(*args, **kwargs):
        writes = getattr(_THREAD, "value", None)
        if writes is None:
            return rotate(*args, **kwargs)
        writes.defer(functools.partial(rotate, *args, **kwargs))

    @functools.wraps(sort)
    def sort_checkpoints(*args, **kwargs):
        writes = getattr(_THREAD, "value", None)
        if writes is not None:
            writes.finish()
        return sort(*args, **kwargs)

    return {"rotate_checkpoints": rotate_checkpoints, "sort_checkpoints": sort_checkpoints}


# The Trainer's deletions of old checkpoints, looked up in transformers.trainer when it calls them:
# rotate_checkpoints (the end of _save_checkpoint: save_total_limit) and sort_checkpoints (the end
# of train, before it deletes the last checkpoint when save_total_limit=1 and another is best).
_ROTATION = _Swap("transformers.trainer", ("rotate_checkpoints", "sort_checkpoints"), _deferring_deletions)
