"""tests/frameworks is run by tools/ci/frameworks.sh, each test_<name>.py in a virtualenv holding
its framework. Under any other Python (tools/run-tests.sh's pytest over tests/, in the project
virtualenv), a test file whose framework cannot be imported is not collected: it is not a test
that was skipped here but one that runs in its own virtualenv."""
import importlib.util

# test file -> the module its framework must provide
_NEEDS = {"test_lightning.py": "lightning", "test_transformers.py": "transformers", "test_trl.py": "trl",
          "test_accelerate.py": "accelerate",
          "test_verl.py": "verl", "test_deepspeed.py": "deepspeed",
          "test_torchtitan.py": "torchtitan"}

collect_ignore = [f for f, module in _NEEDS.items() if importlib.util.find_spec(module) is None]
