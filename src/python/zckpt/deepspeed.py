"""DeepSpeed checkpoints as zckpt containers: `zckpt.deepspeed.use_zckpt(engine)`, once, on the
engine deepspeed.initialize returned, before it saves or resumes (DeepSpeed 0.19.8 tested).

From then on `engine.save_checkpoint` writes every file DeepSpeed hands its checkpoint engine
(mp_rank_XX_model_states, each rank's [bf16_]zero_pp_rank_R_mp_rank_XX_optim_states, and what
else goes through it: save_16bit_model's file, MoE expert files) as a container NAME.zckpt
(zckpt.save of the same object torch.save would get: atomic, the pickle vetted on load) where
DeepSpeed names NAME.pt. The name differs because DeepSpeed's own tools read the .pt files with
torch.load, not through the engine (utils/zero_to_fp32.py, which the save copies beside the
files and ZeRO 3's load_checkpoint(load_optimizer_states=False) calls, and
checkpoint/ds_to_universal.py): they find no .pt instead of misreading a container.
`latest` and zero_to_fp32.py stay DeepSpeed's own files.

`engine.load_checkpoint` reads, for each NAME.pt DeepSpeed asks for, NAME.zckpt when it is
there (and not older than a NAME.pt beside it), a container saved under the .pt name itself,
and otherwise the .pt through torch.load as DeepSpeed's default engine does: a checkpoint
saved before zckpt was plugged in resumes unchanged. A damaged container raises
zckpt.CorruptError naming the file and the chunk.

DeepSpeed's files hold a few objects of its own (ZeRO's LossScaler, ZeroStageEnum,
fragment_address) and zckpt.save writes only pickles of the allowlist's data globals, so each
object of a `deepspeed.` class is written as the plain dict {OBJECT_KEY: 'module:Class', ...} and
rebuilt by this engine's load (read_file). A container `zckpt export`ed back to .pt holds those
dicts.
"""
import collections
import enum
import glob
import importlib
import os

import torch
from deepspeed.runtime.checkpoint_engine.checkpoint_engine import CheckpointEngine

from . import _api, _save
from ._errors import ZckptError
from ._framework_io import is_container

# The suffix DeepSpeed gives every checkpoint file, and the one its container gets instead.
_TORCH_SUFFIX = ".pt"
_CONTAINER_SUFFIX = ".zckpt"
ENGINE_NAME = "ZckptCheckpointEngine"
# The key marking a DeepSpeed object written as data, and the only modules whose classes the load
# rebuilds from such a dict (DeepSpeed's own: the process runs its code anyway).
OBJECT_KEY = "__zckpt_deepspeed_object__"
_TRUSTED_MODULE = "deepspeed."
_PLAIN_DICTS = (dict, collections.OrderedDict)
_PLAIN_SEQUENCES = (list, tuple)


def _replaced(obj, replace, memo):
    """`obj` with replace(x) put for each x that it maps to something other than None, through
    plain dicts, lists and tuples; containers where nothing is replaced come back as they are (no
    copy), shared ones stay shared."""
    if id(obj) in memo:
        return memo[id(obj)][1]
    out = replace(obj)
    if out is None:
        cls = type(obj)
        if cls in _PLAIN_DICTS:
            items = [(k, _replaced(v, replace, memo)) for k, v in obj.items()]
            out = obj if all(v is obj[k] for k, v in items) else cls(items)
        elif cls in _PLAIN_SEQUENCES:
            items = [_replaced(v, replace, memo) for v in obj]
            out = obj if all(a is b for a, b in zip(items, obj)) else cls(items)
        else:
            return obj
    memo[id(obj)] = (obj, out)  # obj kept alive: its id is not reused during the walk
    return out


def _data_form(obj):
    """The plain dict an object of a DeepSpeed class is written as; None for anything else."""
    cls = type(obj)
    if not cls.__module__.startswith(_TRUSTED_MODULE):
        return None
    name = f"{cls.__module__}:{cls.__qualname__}"
    if isinstance(obj, enum.Enum):
        return {OBJECT_KEY: name, "value": obj.value}
    return {OBJECT_KEY: name, "state": _as_data(dict(vars(obj)))}


def _rebuilt(form):
    """The DeepSpeed object a data form stands for; None for anything else."""
    if type(form) not in _PLAIN_DICTS or OBJECT_KEY not in form:
        return None
    name = form[OBJECT_KEY]
    module, _, qualname = name.partition(":")
    if not module.startswith(_TRUSTED_MODULE):
        raise ZckptError(f"{OBJECT_KEY} names {name!r}, not a class of DeepSpeed's: refused")
    cls = importlib.import_module(module)
    for part in qualname.split("."):
        cls = getattr(cls, part)
    if issubclass(cls, enum.Enum):
        return cls(form["value"])
    obj = cls.__new__(cls)
    obj.__dict__.update(_from_data(form["state"]))
    return obj


def _as_data(obj):
    return _replaced(obj, _data_form, {})


def _from_data(obj):
    return _replaced(obj, _rebuilt, {})


def container_path(path):
    """Where the container for DeepSpeed's file `path` goes: NAME.pt -> NAME.zckpt."""
    if path.endswith(_CONTAINER_SUFFIX):
        return path
    stem = path[:-len(_TORCH_SUFFIX)] if path.endswith(_TORCH_SUFFIX) else path
    return stem + _CONTAINER_SUFFIX


def _to_read(path):
    """The file a load of DeepSpeed's `path` reads: its container unless a .pt written later is
    beside it (a save made after this one with DeepSpeed's default engine)."""
    container = container_path(path)
    if container != path and os.path.isfile(container):
        if not os.path.isfile(path) or os.path.getmtime(path) <= os.path.getmtime(container):
            return container
    return path


def read_file(path, map_location=None):
    """What DeepSpeed saved at `path`: a container through zckpt.load (its DeepSpeed objects
    rebuilt), any other file through torch.load, as DeepSpeed's default engine reads it
    (weights_only=False: its files hold its own objects)."""
    if is_container(path):  # a container whatever its name
        return _from_data(_api.load(path, map_location=map_location, weights_only=False))
    return torch.load(path, map_location=map_location, weights_only=False)


class ZckptCheckpointEngine(CheckpointEngine):
    """DeepSpeed's CheckpointEngine over zckpt.save / zckpt.load (see the module docstring)."""

    def __init__(self, config_params=None):
        super().__init__(config_params)
        self.name = ENGINE_NAME

    def create(self, info):
        pass

    def save(self, state_dict, path):
        container = container_path(path)
        _save.save(_as_data(state_dict), container)
        # The save replaces what DeepSpeed's engine would have written at `path`: an older .pt
        # there would otherwise be a second, different copy of this file in the checkpoint.
        if container != path and os.path.isfile(path):
            os.remove(path)

    def load(self, path, map_location=None):
        return read_file(_to_read(path), map_location)

    def commit(self, info):
        return True


def _finding_containers(engine):
    """engine._get_all_ckpt_names (the glob of mp_rank_*_model_states.pt that decides what a
    load reads) also finding the containers: each file once, as NAME.pt where that exists (the
    load then picks the newer of the two), as NAME.zckpt otherwise."""
    torch_names = engine._get_all_ckpt_names

    def get_all_ckpt_names(checkpoints_path, tag):
        # The pattern DeepSpeed's own _get_all_ckpt_names globs (engine.py, 0.19.8).
        pattern = engine._get_ckpt_name(checkpoints_path, tag, mp_placeholder="*",
                                        pp_placeholder="0" if engine.load_universal_checkpoint() else None)
        found = set(torch_names(checkpoints_path, tag))
        for container in glob.glob(container_path(pattern)):
            if not any(container_path(name) == container for name in found):
                found.add(container)
        return sorted(found)

    return get_all_ckpt_names


def use_zckpt(engine):
    """Plugs zckpt into an initialised DeepSpeed engine (idempotent); returns the engine."""
    if isinstance(engine.checkpoint_engine, ZckptCheckpointEngine):
        return engine
    engine.checkpoint_engine = ZckptCheckpointEngine()
    engine._get_all_ckpt_names = _finding_containers(engine)
    return engine
