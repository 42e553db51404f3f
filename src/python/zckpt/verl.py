"""verl's FSDP checkpoints as zckpt containers: `zckpt.verl.use_zckpt()`, once per process, before
the trainer saves or resumes (verl's checkpoint managers take no I/O setting).

From then on verl's `FSDPCheckpointManager` (FSDP1 and FSDP2; verl 0.9.1 tested):

- `save_checkpoint` writes each rank's `model_`, `optim_` and `extra_state_world_size_W_rank_R`
  as `.zckpt` containers (zckpt.save of the same objects verl passes to torch.save: atomic, the
  pickle vetted on load) instead of `.pt` files; everything else it writes (huggingface/,
  fsdp_config.json, the rotation of old steps) is verl's own.
- `load_checkpoint` of a folder holding those containers resumes in place: the model's live
  parameters (FSDP1 FlatParameter shards, FSDP2 local shards) and the optimizer's live state
  are filled by `zckpt.load_into` straight from the file (no state-dict copy, nothing staged on
  the device), the scheduler and RNG states by `zckpt.load`. A folder of `.pt` files (a save
  made before zckpt was plugged in) resumes through verl's own code, unchanged.
- A load that fails on any rank (a corrupt chunk: zckpt.CorruptError naming the file and the
  chunk) fails on every rank before the trainer goes on; the others raise ZckptError naming the
  rank and its error, instead of waiting in verl's barrier.
"""
import inspect
import os
import re

import torch

from ._errors import ZckptError

_RANK_FILE = re.compile(r"^(model|optim|extra_state)_world_size_[0-9]+_rank_[0-9]+\.pt$")
# Optimizers whose step with zero gradients at lr 0 leaves every parameter as it was: a fresh one
# gets the state tensors of such a step (make_optimizer_state), for load_into to fill. Another
# optimizer without state is loaded through its own load_state_dict.
_ZERO_STEP_SAFE = (torch.optim.Adam, torch.optim.AdamW, torch.optim.SGD)


def _container(path):
    return os.path.splitext(path)[0] + ".zckpt"


class _TorchSavingContainers:
    """What verl's checkpoint module sees as `torch`: torch itself, except that torch.save of a
    verl rank file writes the container beside the path instead."""

    def __init__(self, real):
        self._real = real

    def __getattr__(self, name):
        return getattr(self._real, name)

    def save(self, obj, f, *args, **kwargs):
        if isinstance(f, (str, os.PathLike)) and _RANK_FILE.match(os.path.basename(os.fspath(f))):
            from ._save import save

            save(obj, _container(os.fspath(f)))
            return None
        return self._real.save(obj, f, *args, **kwargs)


def _has_optimizer_state(optimizer):
    return any(optimizer.state.get(p) for group in optimizer.param_groups for p in group["params"])


def _local(p):
    """A parameter's local tensor (an FSDP2 DTensor's shard; any other parameter itself)."""
    return p.to_local() if hasattr(p, "to_local") else p


def _first_step_layout(optimizer, group, like):
    """The state `optimizer`'s class gives a parameter of `like`'s dtype and device in a group of
    `group`'s options after one step, found on a probe of 3 elements stepped with a zero gradient
    at lr 0: name -> None for a tensor shaped as the parameter, else the probe's own value (a
    scalar tensor such as Adam's step, or a number). None when the probe cannot be made or an
    entry is shaped otherwise (a state whose layout depends on the parameter's shape)."""
    probe = torch.zeros(3, dtype=like.dtype, device=like.device, requires_grad=True)
    cls = type(optimizer)
    try:
        # The constructor's own arguments only (AdamW's defaults hold decoupled_weight_decay, which
        # it sets itself); the group's options, the others included, are copied after.
        takes = inspect.signature(cls.__init__).parameters
        stepped = cls([probe], **{k: v for k, v in optimizer.defaults.items() if k in takes})
        stepped.param_groups[0].update({k: v for k, v in group.items() if k != "params"})
        stepped.param_groups[0]["lr"] = 0.0
        probe.grad = torch.zeros_like(probe)
        stepped.step()
    except Exception:  # noqa: BLE001 - an optimizer the probe cannot stand for: the real step instead
        return None
    layout = {}
    for name, value in stepped.state[probe].items():
        if torch.is_tensor(value) and value.shape == probe.shape:
            layout[name] = None
        elif torch.is_tensor(value) and value.dim() > 0:
            return None
        else:
            layout[name] = value
    return layout


def _allocate_first_step_state(optimizer):
    """Gives each parameter with elements the state entries its first step would (_first_step_layout),
    tensors shaped as the parameter left unfilled (zckpt.load_into writes every byte of them);
    False, with nothing changed, when some group's layout cannot be found."""
    layouts, plan = {}, []
    for i, group in enumerate(optimizer.param_groups):
        for p in group["params"]:
            if not p.numel():
                continue
            local = _local(p)
            key = (i, local.dtype, local.device)
            if key not in layouts:
                layouts[key] = _first_step_layout(optimizer, group, local)
            if layouts[key] is None:
                return False
            plan.append((p, layouts[key]))
    for p, layout in plan:
        optimizer.state[p] = {name: torch.empty_like(p) if value is None else
                              (value.clone() if torch.is_tensor(value) else value) for name, value in layout.items()}
    return True


def make_optimizer_state(optimizer):
    """Gives a fresh optimizer its state tensors, for zckpt.load_into to fill in place: the
    entries its first step would make, allocated without running that step over the model (no
    gradients, no arithmetic: _allocate_first_step_state); where a probe cannot tell them, one
    real step with zero gradients at lr 0 (what torch.distributed.checkpoint does before loading
    an optimizer), which leaves every parameter as it was under Adam, AdamW and SGD. Parameters
    with no elements on this rank get no state (FSDP gives them no gradient). Nothing happens to
    an optimizer that already holds state."""
    if _has_optimizer_state(optimizer) or _allocate_first_step_state(optimizer):
        return
    lrs = [group["lr"] for group in optimizer.param_groups]
    try:
        for group in optimizer.param_groups:
            group["lr"] = 0.0
            for p in group["params"]:
                if p.numel():
                    p.grad = torch.zeros_like(p)
        optimizer.step()
    finally:
        for group, lr in zip(optimizer.param_groups, lrs):
            group["lr"] = lr
        optimizer.zero_grad(set_to_none=True)


def _is_lora_only(path):
    from . import _records

    names = [r.name for r in _records.of_path(path) if not r.internal]
    return bool(names) and all("lora_" in n or ".adapter_" in n for n in names)


def _state_ctx(module, manager):
    """verl's own state-dict context of its loads (SHARDED_STATE_DICT), for the loads that go
    through load_state_dict."""
    offload = bool(module.is_cuda_available)
    return module.get_fsdp_state_ctx(manager.model, module.StateDictType.SHARDED_STATE_DICT,
                                     module.ShardedStateDictConfig(offload_to_cpu=offload),
                                     module.ShardedOptimStateDictConfig(offload_to_cpu=offload))


def _load_rank(module, manager, local_path):
    """This rank's load of the containers in `local_path`: in place where the target holds its
    tensors, through load_state_dict (as verl) where it does not."""
    from . import _api

    rank, world = manager.rank, manager.world_size
    path = lambda family: os.path.join(local_path, f"{family}_world_size_{world}_rank_{rank}.zckpt")  # noqa: E731
    if manager.should_load_model:
        if _is_lora_only(path("model")):
            # LoRA adapters alone: verl's own strict=False load of the (small) state dict.
            with _state_ctx(module, manager):
                manager.model.load_state_dict(_api.load(path("model"), weights_only=False), strict=False)
        else:
            _api.load_into(path("model"), manager.model)
    if manager.should_load_optimizer:
        optimizer = manager.optimizer
        if not _has_optimizer_state(optimizer) and not isinstance(optimizer, _ZERO_STEP_SAFE):
            with _state_ctx(module, manager):
                optimizer.load_state_dict(_api.load(path("optim"), weights_only=False))
        else:
            make_optimizer_state(optimizer)
            _api.load_into(path("optim"), optimizer)
    if manager.should_load_extra:
        extra = _api.load(path("extra_state"), weights_only=False)
        if "rng" in extra:
            manager.load_rng_state(extra["rng"])
        if extra.get("lr_scheduler") is not None and manager.lr_scheduler is not None:
            manager.lr_scheduler.load_state_dict(extra["lr_scheduler"])


def _fail_together(error):
    """Every rank learns whether any rank's load failed; each that did not raises naming one that did."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        if error is not None:
            raise error
        return
    errors = [None] * dist.get_world_size()
    dist.all_gather_object(errors, None if error is None else f"{type(error).__name__}: {error}")
    if error is not None:
        raise error
    failed = [(r, e) for r, e in enumerate(errors) if e is not None]
    if failed:
        rank, what = failed[0]
        raise ZckptError(f"the checkpoint load failed on rank {rank} ({what}); this rank stops too")


def use_zckpt():
    """Plugs zckpt into verl's FSDPCheckpointManager for this process (idempotent). Returns the class."""
    from verl.utils.checkpoint import fsdp_checkpoint_manager as module

    cls = module.FSDPCheckpointManager
    if getattr(cls, "_zckpt_plugged", False):
        return cls
    if not isinstance(module.torch, _TorchSavingContainers):
        module.torch = _TorchSavingContainers(module.torch)
    verl_load = cls.load_checkpoint

    def load_checkpoint(self, local_path, hdfs_path=None, del_local_after_load=False):
        mine = local_path is not None and os.path.isfile(
            os.path.join(local_path, f"model_world_size_{self.world_size}_rank_{self.rank}.zckpt"))
        if not mine:
            return verl_load(self, local_path, hdfs_path, del_local_after_load)
        error = None
        try:
            _load_rank(module, self, local_path)
        except Exception as e:  # noqa: BLE001 - raised below, on every rank
            error = e
        _fail_together(error)
        torch.distributed.barrier()

    load_checkpoint.__doc__ = verl_load.__doc__
    cls.load_checkpoint = load_checkpoint
    cls._zckpt_plugged = True
    return cls
