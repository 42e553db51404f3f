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


def size(name, value):
    """A size or a thread count (threads, slots, slot_bytes, chunk_bytes) as the package hands it
    on: None for the default, else the positive int given. The one rule of the library, Python
    and the `zckpt` command: None (unset) and 0 both mean the default, chosen automatically
    (LoadOptions in zckpt/load_options.h and WriterOptions in zckpt/container_writer.h say what
    each resolves to). Anything but None or an int >= 0 is a ValueError naming the argument."""
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
        raise ValueError(f"{name} must be a positive integer (0 or None for the default), not {value!r}")
    return value or None


def ring_sizes(threads, slots, slot_bytes):
    """The loader's ring from the keyword arguments of load and load_into (the names of `zckpt load
    --threads --slots --slot-bytes`), as a dict of size()s."""
    return {"threads": size("threads", threads), "slots": size("slots", slots),
            "slot_bytes": size("slot_bytes", slot_bytes)}
