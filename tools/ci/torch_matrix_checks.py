"""The checks tools/ci/torch-matrix.sh runs in each virtualenv, against the build folder's zckpt
package (on PYTHONPATH) and zckpt binary (ZCKPT_CLI_DIR): one line per check, `ok NAME` or
`FAIL NAME: why`; exits 1 when any failed.

  torch_matrix_checks.py torch DIR      under a torch 2.x: the Python API end to end
  torch_matrix_checks.py inputs DIR     (a torch venv) writes what the no-torch checks read
  torch_matrix_checks.py no-torch DIR   without torch: the command and the torch-free API
  torch_matrix_checks.py outputs DIR    (a torch venv) what the no-torch run wrote, read back
"""
import argparse
import json
import os
import subprocess
import sys
import time
import traceback

failed = 0
# How long `import zckpt` may take in a fresh interpreter: what a CLI wrapper can afford on a
# native machine. tools/ci/platforms.sh raises it under qemu, where every instruction is emulated.
IMPORT_SECONDS = float(os.environ.get("ZCKPT_CHECKS_IMPORT_SECONDS", "1.0"))
PYPROJECT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "pyproject.toml")


def check(name, fn):
    global failed
    try:
        fn()
        print(f"ok {name}", flush=True)
    except Exception as e:  # noqa: BLE001 - every failure is reported, the next check still runs
        failed += 1
        why = f"{type(e).__name__}: {e}" if str(e) else traceback.format_exc(limit=3).strip().replace("\n", " | ")
        print(f"FAIL {name}: {why}", flush=True)


def state():
    """A state dict with what a converter and a loader get wrong first: views into one storage,
    a transposed view, two names for one tensor, dtypes torch.save writes as they are, nesting."""
    import torch

    torch.manual_seed(0)
    w = torch.randn(300, 200)
    return {"w": w, "w_t": w.t(), "rows": w[10:20], "tied": w, "i64": torch.arange(1000),
            "bf16": torch.randn(77).bfloat16(), "f16": torch.randn(5, 5).half(),
            "nested": {"b": torch.randn(300), "mask": torch.rand(64) > 0.5, "deeper": {"c": torch.arange(6).view(2, 3)}},
            "step": 7}


def flat(d, prefix=""):
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(flat(v, f"{prefix}{k}."))
        else:
            out[prefix + k] = v
    return out


def assert_equal_trees(got, want, where="the root"):
    """got is what torch.load gives for want: the same nesting (a dict where want has one, not
    flattened names), keys in the same order, tensors equal with dtype and shape, the rest ==."""
    import torch

    if isinstance(want, dict):
        assert isinstance(got, dict), f"{where}: {type(got).__name__} where a dict was saved"
        assert list(got) == list(want), f"{where}: keys {list(got)} != {list(want)}"
        for k in want:
            assert_equal_trees(got[k], want[k], f"'{k}'" if where == "the root" else f"{where[:-1]}.{k}'")
    elif isinstance(want, torch.Tensor):
        assert isinstance(got, torch.Tensor), f"{where}: {type(got).__name__} where a tensor was saved"
        assert got.dtype == want.dtype and got.shape == want.shape and torch.equal(got, want), f"{where} differs"
    else:
        assert type(got) is type(want) and got == want, f"{where}: {got!r} != {want!r}"


def fresh_import_seconds():
    code = "import sys, time; t = time.perf_counter(); import zckpt; print(time.perf_counter() - t, 'torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    return float(out[0]), out[1] == "True"


def import_check():
    seconds, torch_imported = fresh_import_seconds()
    assert not torch_imported, "import zckpt imported torch"
    assert seconds < IMPORT_SECONDS, f"import zckpt took {seconds:.2f} s (limit {IMPORT_SECONDS} s)"


def torch_checks(d):
    import torch

    import zckpt

    print(f"# torch {torch.__version__}, zckpt from {os.path.dirname(zckpt.__file__)}", flush=True)
    saved = state()
    pt, zc = os.path.join(d, "m.pt"), os.path.join(d, "m.zckpt")
    torch.save(saved, pt)
    check("convert", lambda: zckpt.convert(pt, zc))
    check("verify", lambda: (lambda r: None if r == [] else (_ for _ in ()).throw(AssertionError(r)))(zckpt.verify(zc)))

    def load():
        for mmap in (False, True):
            got = zckpt.load(zc, mmap=mmap)
            assert_equal_trees(got, torch.load(pt, weights_only=True))
            ptr = got["w"].untyped_storage().data_ptr()
            assert got["w_t"].untyped_storage().data_ptr() == ptr, "the view lost its storage"
            assert got["rows"].untyped_storage().data_ptr() == ptr and got["tied"] is got["w"], "sharing lost"
    check("load_equals_torch_load", load)

    def load_into():
        target = {k: torch.zeros_like(v) for k, v in flat(saved).items() if isinstance(v, torch.Tensor)}
        target["w_t"] = torch.zeros(200, 300)  # contiguous, where the saved one is a transposed view
        ptrs = {k: v.data_ptr() for k, v in target.items()}
        missing, unexpected = zckpt.load_into(zc, target)
        assert (missing, unexpected) == ([], []), (missing, unexpected)
        assert {k: v.data_ptr() for k, v in target.items()} == ptrs, "not in place"
        for k, v in target.items():
            assert torch.equal(v, flat(saved)[k]), f"'{k}' differs"
    check("load_into_in_place", load_into)

    def iter_tensors():
        for kw in ({}, {"mmap": True}, {"verify_first": True}):
            got = dict(zckpt.iter_tensors(zc, **kw))
            want = {k: v for k, v in flat(saved).items() if isinstance(v, torch.Tensor)}
            assert got.keys() == want.keys(), (kw, sorted(got.keys() ^ want.keys()))
            for k, v in want.items():
                assert torch.equal(got[k], v), (kw, k)
    check("iter_tensors", iter_tensors)

    def save_export():
        out, back = os.path.join(d, "saved.zckpt"), os.path.join(d, "saved.pt")
        zckpt.save(saved, out)
        zckpt.export(out, back)
        assert_equal_trees(torch.load(back, weights_only=True), saved)
    check("save_then_torch_load_of_export", save_export)

    def dcp_save_load():
        # zckpt.dcp stands on _core and torch's Python API only: it must work under every torch.
        # One process, no process group: DCP saves and loads in that process alone.
        import torch.distributed.checkpoint as dcp
        from zckpt.dcp import ZckptStorageReader, ZckptStorageWriter

        folder = os.path.join(d, "dcp")
        tensors = {k: v for k, v in flat(saved).items() if isinstance(v, torch.Tensor)}
        dcp.save(tensors, storage_writer=ZckptStorageWriter(folder))
        back = {k: torch.zeros_like(v) for k, v in tensors.items()}
        back["w_t"] = torch.zeros(300, 200).t()  # a non-contiguous destination, as the saved view
        dcp.load(back, storage_reader=ZckptStorageReader(folder))
        for k, v in tensors.items():
            assert back[k].dtype == v.dtype and torch.equal(back[k], v), f"'{k}' differs"
    check("dcp_save_load", dcp_save_load)

    def vllm_entry_point():
        # What vLLM finds: the installed wheel's entry point in vllm.general_plugins, which must
        # load a callable. A build folder has no dist-info: there pyproject.toml's
        # [project.entry-points."vllm.general_plugins"] is read instead (tomllib: Python 3.11+).
        import importlib
        import importlib.metadata as md

        try:
            md.distribution("zckpt")
        except md.PackageNotFoundError:
            import tomllib

            with open(PYPROJECT, "rb") as f:
                plugins = tomllib.load(f)["project"]["entry-points"]["vllm.general_plugins"]
            assert "zckpt" in plugins, f"pyproject.toml's vllm.general_plugins: {plugins}"
            module, _, fn = plugins["zckpt"].partition(":")
            assert callable(getattr(importlib.import_module(module), fn)), plugins["zckpt"]
            return
        eps = md.entry_points()
        group = eps.select(group="vllm.general_plugins") if hasattr(eps, "select") else eps.get("vllm.general_plugins", [])
        found = [ep for ep in group if ep.name == "zckpt"]
        assert found, f"the installed zckpt declares no vllm.general_plugins entry point 'zckpt': {list(group)}"
        assert callable(found[0].load()), found[0].value
    check("vllm_plugin_entry_point", vllm_entry_point)
    check("import_under_a_second_without_torch", import_check)
    check("libzckpt_never_imported", lambda: None if "zckpt._C" not in sys.modules else
          (_ for _ in ()).throw(AssertionError("a CPU path imported zckpt._C")))


def write_inputs(d):
    """What the no-torch run reads: a .pt torch wrote, a DCP folder DCP wrote."""
    import torch
    import torch.distributed.checkpoint as dcp

    torch.save(state(), os.path.join(d, "m.pt"))
    tensors = {k: v for k, v in flat(state()).items() if k in ("w", "i64", "bf16", "nested.b")}
    dcp.save(tensors, checkpoint_id=os.path.join(d, "dcp"))
    print("ok inputs_written", flush=True)


def run_cli(*args):
    cmd = [sys.executable, "-m", "zckpt", *args]
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0, f"{' '.join(args)}: exit {r.returncode}: {(r.stdout + r.stderr)[-800:]}"
    return r.stdout


def no_torch_checks(d):
    import importlib.util

    assert importlib.util.find_spec("torch") is None, "torch is importable in the no-torch venv"
    pt, zc = os.path.join(d, "m.pt"), os.path.join(d, "m.zckpt")
    check("cli_convert", lambda: run_cli("convert", pt, "-o", zc))
    check("cli_verify", lambda: run_cli("verify", zc))

    def ls_json():
        doc = json.loads(run_cli("ls", "--json", zc))
        names = {t["name"] for t in doc["tensors"]}
        assert {"w", "w_t", "rows", "nested.b"} <= names, sorted(names)
    check("cli_ls_json", ls_json)
    check("cli_export", lambda: run_cli("export", zc, "-o", os.path.join(d, "back.pt")))

    def cli_load():
        for mode in ([], ["--into"], ["--map"]):
            doc = json.loads(run_cli("load", "--json", zc, *mode))
            assert doc["status"] == "ok" and doc["verified"] and doc["bytes"] > 0, doc
    check("cli_load", cli_load)
    check("cli_merge_dcp_folder", lambda: run_cli("merge", os.path.join(d, "dcp"), "-o", os.path.join(d, "merged.zckpt")))

    def api():
        import zckpt

        assert zckpt.verify(zc) == []
        try:
            zckpt.load(zc)
        except ImportError as e:
            assert "needs torch" in str(e), str(e)
        else:
            raise AssertionError("zckpt.load returned without torch")
    check("import_verify_and_load_says_torch_is_needed", api)
    check("import_under_a_second", import_check)


def read_outputs(d):
    """The no-torch run's export and merge, read back by torch and zckpt."""
    import torch

    import zckpt

    def export():
        assert_equal_trees(torch.load(os.path.join(d, "back.pt"), weights_only=True), state())
    check("no_torch_export_equals_the_original", export)

    def merged():
        got = zckpt.load(os.path.join(d, "merged.zckpt"))
        want = {k: v for k, v in flat(state()).items() if k in ("w", "i64", "bf16", "nested.b")}
        assert got.keys() == want.keys(), sorted(got.keys() ^ want.keys())
        for k, v in want.items():
            assert torch.equal(got[k], v), k
    check("no_torch_merge_equals_what_dcp_saved", merged)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("mode", choices=["torch", "inputs", "no-torch", "outputs"])
    p.add_argument("dir")
    a = p.parse_args()
    t0 = time.perf_counter()
    {"torch": torch_checks, "inputs": write_inputs, "no-torch": no_torch_checks, "outputs": read_outputs}[a.mode](a.dir)
    print(f"# {a.mode}: {time.perf_counter() - t0:.1f} s", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
