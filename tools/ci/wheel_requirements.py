"""The requirements a wheel's METADATA states for another machine, one per line, markers evaluated
for that machine (Linux, CPython, the given version and architecture) and dropped:

  wheel_requirements.py WHEEL PYTAG ARCH     e.g. torch-2.9.1-...aarch64.whl 311 aarch64

`pip download --platform` evaluates markers against the machine it runs on, so for torch, whose
CUDA packages are marked for x86_64 alone, it asks for packages no aarch64 wheel exists for
(tools/ci/platforms.sh feeds this to pip download instead).
"""
import sys
import zipfile
from email.parser import Parser

from pip._vendor.packaging.requirements import Requirement


def main():
    wheel, pytag, arch = sys.argv[1:4]
    version = f"{pytag[0]}.{pytag[1:]}"
    env = {"platform_machine": arch, "platform_system": "Linux", "sys_platform": "linux", "os_name": "posix",
           "python_version": version, "python_full_version": version + ".0", "implementation_name": "cpython",
           "platform_python_implementation": "CPython", "extra": ""}
    with zipfile.ZipFile(wheel) as z:
        name = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        meta = Parser().parsestr(z.read(name).decode())
    for line in meta.get_all("Requires-Dist") or []:
        req = Requirement(line)
        if req.marker is None or req.marker.evaluate(env):
            req.marker = None
            print(req)


if __name__ == "__main__":
    main()
