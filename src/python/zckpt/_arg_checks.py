"""Arguments every entry point takes, checked and converted the same way; no torch here except
what a weights-only load asks torch for (its registered safe globals)."""
import os


def path_of(f):
    """The path of `f` (a str or os.PathLike; zckpt works on paths, not file objects)."""
    if isinstance(f, (str, os.PathLike)):
        return os.fspath(f)
    raise TypeError(f"zckpt works on paths, not {type(f).__name__}")


def global_name(g):
    """'module.name' of an allow_globals entry: the string itself, or a class/function's own."""
    if isinstance(g, str):
        return g
    module, name = getattr(g, "__module__", None), getattr(g, "__qualname__", None)
    if not module or not name:
        raise TypeError(f"allow_globals takes 'module.name' strings, classes and functions, not {g!r}")
    return f"{module}.{name}"


def allowed_globals(allow_globals, weights_only=False):
    """The globals ('module.name') a pickle may name besides zckpt's allowlist: what the caller
    lists and, for a weights-only load, what the caller registered with torch as safe globals
    (torch.serialization.add_safe_globals / safe_globals)."""
    if isinstance(allow_globals, (str, bytes)):
        raise TypeError("allow_globals takes a list of names, not one string")
    names = [global_name(g) for g in allow_globals]
    if weights_only:
        import torch

        for g in torch.serialization.get_safe_globals():
            if isinstance(g, tuple):  # (obj, "module.name")
                names.append(g[1])
            else:
                names.append(global_name(g))
    return names


def ring_sizes(threads, slots, slot_bytes):
    """The loader's ring from the keyword arguments of load and load_into (the names of `zckpt load
    --threads --slots --slot-bytes`), as a dict: None or 0 leaves the library's default
    (LoadOptions in zckpt/load_options.h says what each resolves to)."""
    values = {"threads": threads, "slots": slots, "slot_bytes": slot_bytes}
    for name, v in values.items():
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
            raise ValueError(f"{name} must be a positive integer (or None for the default), not {v!r}")
    return {k: v or None for k, v in values.items()}
