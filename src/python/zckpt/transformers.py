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
`pip install zckpt[transformers]`. What is not covered: docs/integrations.md.
"""
from ._framework_io import checkpoint_io_through_zckpt, wrap_methods

# The Trainer's methods under which torch.save writes containers and torch.load reads them, and DCP's
# file-system storage is zckpt's: train (the resume: _load_from_checkpoint, _load_optimizer_and_scheduler,
# _load_scaler, _load_rng_state, and every checkpoint saved while training), _save_checkpoint (one
# checkpoint folder) and save_model (training_args.bin; under FSDP the model's folder).
_WRAPPED = ("train", "_save_checkpoint", "save_model")


def use_zckpt(trainer):
    """Makes `trainer` (a transformers.Trainer, or a subclass's instance) write and resume its
    checkpoints through zckpt (see the module's docstring); returns it. Calling it twice is
    harmless."""
    try:
        from transformers import Trainer
    except ImportError as e:
        raise ImportError(f"zckpt.transformers needs transformers ({e}): pip install zckpt[transformers]") from e
    if not isinstance(trainer, Trainer):
        raise TypeError(f"use_zckpt takes a transformers.Trainer, not {type(trainer).__name__}")
    wrap_methods(trainer, _WRAPPED, through=checkpoint_io_through_zckpt)
    return trainer

