"""accelerate's save_state / load_state through zckpt: `accelerator = zckpt.accelerate.use_zckpt(accelerator)`.

Takes an accelerate.Accelerator and returns it, changed in place: from then on every file
`save_state` writes with torch.save (the optimizers, schedulers, samplers, dataloaders, the
gradient scaler, random_states_R.pkl per rank, the objects registered with
register_for_checkpointing) is a container, written atomically with every chunk checksummed, and
`load_state` reads them back through zckpt.load, in place: a damaged file raises
zckpt.CorruptError naming the file and chunk before anything is restored. The models' weights too:
under use_zckpt, save_state's safe_serialization defaults to False, so they are written with
torch.save (pytorch_model.bin, a container) where accelerate's default is model.safetensors, which
zckpt does not check; pass safe_serialization=True to keep safetensors. A folder written before
zckpt was plugged in (torch.save and safetensors files) loads too. `pip install zckpt[accelerate]`.

Under FSDP, save_state and load_state call accelerate's FSDP checkpoint functions
(accelerate.utils.fsdp_utils: save_fsdp_model, save_fsdp_optimizer and their loads). With
FULL_STATE_DICT they use torch.save / torch.load, routed as above; with SHARDED_STATE_DICT they
build DCP's FileSystemWriter / FileSystemReader, which become zckpt.dcp's ZckptStorageWriter (one
container per rank, no `.distcp`) and, for a folder holding containers, ZckptStorageReader: a
damaged chunk raises zckpt.CorruptError on every rank. A `.distcp` folder written before zckpt was
plugged in is read by DCP's own reader. `fsdp_io()` is that routing as a with block, for code that
calls those functions itself.
"""
import functools

from ._framework_io import checkpoint_io_through_zckpt, wrap_methods


def fsdp_io():
    """A with block inside which accelerate's FSDP checkpoint functions (save_fsdp_model,
    load_fsdp_model, save_fsdp_optimizer, load_fsdp_optimizer), and any other code in the process,
    write and read through zckpt: torch.save / torch.load as in save_state, DCP's FileSystemWriter /
    FileSystemReader as zckpt.dcp's storage (see the module's docstring). save_state and load_state
    under use_zckpt run inside it; blocks nest."""
    return checkpoint_io_through_zckpt()


def use_zckpt(accelerator):
    """Makes `accelerator` save and load its state through zckpt (see the module's docstring);
    returns it. Calling it twice is harmless."""
    try:
        from accelerate import Accelerator
    except ImportError as e:
        raise ImportError(f"zckpt.accelerate needs accelerate ({e}): pip install zckpt[accelerate]") from e
    if not isinstance(accelerator, Accelerator):
        raise TypeError(f"use_zckpt takes an accelerate.Accelerator, not {type(accelerator).__name__}")
    save_state = accelerator.save_state
    if not getattr(save_state, "_zckpt_wrapped", False):
        @functools.wraps(save_state)
        def save_state_as_containers(output_dir=None, safe_serialization=False, **kwargs):
            return save_state(output_dir, safe_serialization=safe_serialization, **kwargs)

        accelerator.save_state = save_state_as_containers
    wrap_methods(accelerator, ("save_state", "load_state"), through=fsdp_io)
    return accelerator
