"""zckpt as a vLLM load format: `LLM(model=DIR, load_format="zckpt")`, `vllm serve DIR
--load-format zckpt`, where DIR was written by `zckpt convert HF_DIR -o DIR/` (config and
tokenizer files copied beside the containers).

Registered through vLLM's plugin entry point (group `vllm.general_plugins`, in the package's
metadata): `register()` runs in every vLLM process, is idempotent, and does nothing when vLLM is
not installed. Weights come from zckpt.iter_tensors: streamed one tensor at a time, every chunk
checked; a corrupt chunk stops start-up with CorruptError naming file, tensor and byte range.

DIR may also be an object folder, `LLM(model="s3://BUCKET/PREFIX", load_format="zckpt")`: vLLM
pulls its config and tokenizer files into a local folder (with Run:ai's streamer when installed,
else here with zckpt's S3 client; never the containers) and the weights are streamed from the
containers with ranged GETs (one HEAD and one listing find them; see _hook_object_storage for
what this changes in vLLM). Or `model` a local folder holding the config and `model_weights`
the object folder.

Weight reload (the RL update path): `llm.collective_rpc("reload_weights", kwargs={"weights_path":
NEW_DIR_OR_CONTAINER})` re-enters `get_all_weights`, which, before it returns an iterator (so
before vLLM moves any layer to the meta device), checks every chunk of every file of the update
and that it holds exactly the tensors (names, dtypes, shapes) of the checkpoint the engine
started from. An update that fails either check raises and the engine keeps serving the weights
it had.

Options (`model_loader_extra_config`): "verify" (default true: check each chunk as it is read),
"verify_first" (default false at start-up: check every chunk before the first tensor; a reload
always does), "device" (where tensors are streamed to before vLLM copies them into the
parameters; default "cpu"), "mmap" (default true on "cpu": each file mapped and every chunk
checked in the mapping, tensors handed over as views of it, so vLLM's copy into its parameters is
the only copy; false: streamed into fresh tensors; an object in s3:// cannot be mapped, so there
the default is false).
"""
_OPTIONS = {"verify": bool, "verify_first": bool, "device": str, "mmap": bool}
_CHECKPOINT_ATTR = "_zckpt_checkpoint_tensors"  # set on the model at start-up: what an update must match


def register():
    """The `vllm.general_plugins` entry point: registers load format "zckpt". Returns the loader
    class, or None without vLLM."""
    try:
        from vllm.model_executor import model_loader
    except ImportError:
        return None
    registered = getattr(model_loader, "_LOAD_FORMAT_TO_MODEL_LOADER", {}).get("zckpt")
    if registered is not None and getattr(registered, "zckpt_plugin", False):
        return registered
    cls = _loader_class(model_loader.BaseModelLoader)
    model_loader.register_model_loader("zckpt")(cls)
    _hook_object_storage()
    return cls


def _hook_object_storage():
    """`LLM(model="s3://BUCKET/PREFIX", load_format="zckpt")` in vLLM 0.32, which reads an
    object-storage model in two steps that know only Run:ai's streamer. ModelConfig pulls the
    folder's small files into a local folder (`model` then names it, `model_weights` the URL)
    with Run:ai's pull_files, twice: *.json, *.model, *.py, then, for the tokenizer, every file
    but *.safetensors, *.bin, *.pt, *.pth, *.tensors: *.zckpt containers would be downloaded
    whole before the load streams them. VllmConfig then refuses an object `model_weights` to
    every load format but runai_streamer(_sharded) and modelexpress. Here (idempotent, each hook
    marked): *.zckpt is one more weight file the pull leaves out; without Run:ai's S3 package
    the pull is done with zckpt's own S3 client (one listing, one GET a file); the check lets
    load format zckpt through (it reads `model_weights` itself)."""
    try:
        from vllm.config import vllm as vllm_config
        from vllm.transformers_utils import runai_utils
    except ImportError:  # another vLLM layout: nothing to hook
        return
    storage = getattr(runai_utils, "ObjectStorageModel", None)
    if storage is not None and not getattr(storage.pull_files, "zckpt_plugin", False):
        storage.pull_files = _pull_files_hook(storage.pull_files)
    config = getattr(vllm_config, "VllmConfig", None)
    check = getattr(config, "try_verify_and_update_config", None)
    if check is not None and not getattr(check, "zckpt_plugin", False):
        config.try_verify_and_update_config = _verify_hook(check)


def _runai_s3_installed():
    import importlib.util

    return all(importlib.util.find_spec(m) is not None for m in ("runai_model_streamer", "runai_model_streamer_s3"))


def _pull_files_hook(original):
    from . import _paths

    def pull_files(self, model_path="", allow_pattern=None, ignore_pattern=None):
        if ignore_pattern is not None and "*.zckpt" not in ignore_pattern:
            ignore_pattern = [*ignore_pattern, "*.zckpt"]
        if _paths.is_url(model_path) and not _runai_s3_installed():
            return pull_object_folder(model_path, self.dir, allow_pattern, ignore_pattern)
        return original(self, model_path, allow_pattern, ignore_pattern)

    pull_files.zckpt_plugin = True
    return pull_files


def _verify_hook(original):
    from . import _paths

    def try_verify_and_update_config(self):
        model = self.model_config
        weights = getattr(model, "model_weights", "") if model is not None else ""
        if str(self.load_config.load_format) != "zckpt" or not _paths.is_url(weights):
            return original(self)
        model.model_weights = ""  # what vLLM checks there: not its object-storage loaders' model
        try:
            return original(self)
        finally:
            model.model_weights = weights

    try_verify_and_update_config.zckpt_plugin = True
    return try_verify_and_update_config


def pull_object_folder(url, dst, allow_pattern=None, ignore_pattern=None):
    """Run:ai's pull_files with zckpt's S3 client: every object below the folder `url` (any
    depth) whose key matches one of `allow_pattern` (all when None) and none of `ignore_pattern`
    (fnmatch on the whole key, as Run:ai's), written under `dst` by its name below `url`.
    One listing, then one GET a file. Returns the names."""
    import fnmatch
    import os

    from . import _paths

    prefix = url.rstrip("/")[len(_paths.SCHEME):].partition("/")[2]
    root = os.path.realpath(dst)
    names = []
    for name in sorted(_paths.files_under(url)):
        key = f"{prefix}/{name}" if prefix else name
        if name.endswith("/") or (allow_pattern is not None and not any(fnmatch.fnmatch(key, p) for p in allow_pattern)):
            continue
        if ignore_pattern is not None and any(fnmatch.fnmatch(key, p) for p in ignore_pattern):
            continue
        out = os.path.realpath(os.path.join(root, name))
        if os.path.commonpath([root, out]) != root:
            raise ValueError(f"{url}: refusing to write {name!r} outside {dst}")
        os.makedirs(os.path.dirname(out), exist_ok=True)
        _paths.write_atomically(out, _paths.read_bytes(_paths.join(url, name)))
        names.append(name)
    return names


def _checkpoint_path(model_config):
    from . import _paths

    path = getattr(model_config, "model_weights", "") or model_config.model
    # An object is not looked up here: container_files asks the storage once (a HEAD, a listing),
    # and opening a container that is not there says so.
    if not _paths.is_url(path) and not _paths.exists(path):
        raise ValueError(f"load format 'zckpt' reads a folder converted by `zckpt convert` or a .zckpt "
                         f"container (local or s3://); {path!r} is neither (convert a Hugging Face folder with "
                         f"`zckpt convert HF_DIR -o OUT/`)")
    return path


def update_problems(expected, found):
    """Why a checkpoint with tensors `found` cannot replace one with `expected` ({name: (dtype,
    shape)}): missing and unexpected tensors, other dtypes or shapes; [] when it can."""
    problems = [f"missing tensor {n!r}" for n in expected if n not in found]
    problems += [f"unexpected tensor {n!r}" for n in found if n not in expected]
    for n, (dtype, shape) in expected.items():
        if n in found and found[n] != (dtype, shape):
            problems.append(f"tensor {n!r} is {found[n][0]} {list(found[n][1])} in the update, "
                            f"{dtype} {list(shape)} in the serving checkpoint")
    return problems


def _loader_class(base):
    import torch

    from . import _iter

    class ZckptModelLoader(base):
        """vLLM model loader for folders written by `zckpt convert` (see zckpt.vllm_plugin)."""

        zckpt_plugin = True

        def __init__(self, load_config):
            super().__init__(load_config)
            extra = dict(load_config.model_loader_extra_config or {})
            unknown = set(extra) - set(_OPTIONS)
            if unknown:
                raise ValueError(f"unexpected model_loader_extra_config keys for load format 'zckpt': "
                                 f"{sorted(unknown)} (known: {sorted(_OPTIONS)})")
            for key, value in extra.items():
                if not isinstance(value, _OPTIONS[key]):
                    raise ValueError(f"model_loader_extra_config[{key!r}] must be a {_OPTIONS[key].__name__}, "
                                     f"not {value!r}")
            self.verify = extra.get("verify", True)
            self.verify_first = extra.get("verify_first", False)
            self.device = str(torch.device(extra.get("device", "cpu")))
            self.mmap = extra.get("mmap")  # None: mapped when on "cpu" and local

        def download_model(self, model_config):
            _iter.container_files(_checkpoint_path(model_config))  # raises when there is nothing to load

        def _weights(self, path, checkpoints, verify_first):
            from . import _paths

            mmap = self.mmap if self.mmap is not None else self.device == "cpu" and not _paths.is_url(path)
            return _iter.stream(checkpoints, device=self.device, verify=self.verify, verify_first=verify_first,
                                mmap=mmap)

        def load_weights(self, model, model_config):
            path = _checkpoint_path(model_config)
            # Each file opened once: the weights streamed and the table kept come from the same files.
            checkpoints = _iter.open_containers(path)
            loaded = model.load_weights(self._weights(path, checkpoints, self.verify_first))
            if loaded is not None and model_config.quantization is None:
                missing = sorted(n for n, _ in model.named_parameters() if n not in loaded)
                if missing:
                    raise ValueError(f"{path}: these weights were not initialized from the checkpoint: {missing}")
            setattr(model, _CHECKPOINT_ATTR, _iter.table_of(checkpoints))

        def get_all_weights(self, model_config, model):
            """The reload path (vLLM's reload_weights): everything checked before it returns. Each
            file is opened once: the table checked is that of the files streamed (a checkpoint
            renamed over the path meanwhile is never mixed in)."""
            path = _checkpoint_path(model_config)
            checkpoints = _iter.open_containers(path)
            expected = getattr(model, _CHECKPOINT_ATTR, None)
            if expected is not None:
                problems = update_problems(expected, _iter.table_of(checkpoints))
                if problems:
                    raise ValueError(f"{path} cannot update the serving weights (nothing was changed):\n  " +
                                     "\n  ".join(problems))
            return self._weights(path, checkpoints, verify_first=True)

    return ZckptModelLoader
