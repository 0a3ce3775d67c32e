"""Install the pinned PyTorch into the running Python: the CPU build unless asked for CUDA (``make install TORCH=...``).

    python tools/install_torch.py --build cpu     # make install (the default)
    python tools/install_torch.py --build cuda    # make install TORCH=cuda

PyTorch's own install instructions: on Linux, PyPI's ``torch`` is the CUDA build (a ~530 MB wheel plus ~3 GB of
NVIDIA libraries), so the CPU build comes from PyTorch's CPU index; on macOS and Windows PyPI's ``torch`` already is
the CPU build. When PyTorch's index cannot be reached (a machine that reaches only the default package index), the
pinned version comes from the default index instead, with a message; the script then says which build it got.
The version is the one requirements.txt pins. Nothing happens when that version and build are already installed.
"""

from __future__ import annotations

import argparse
import platform
import re
import subprocess
import sys
import urllib.request
from pathlib import Path

REQUIREMENTS = Path(__file__).resolve().parents[1] / "requirements.txt"
CPU_INDEX = "https://download.pytorch.org/whl/cpu"
PIP = [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]


def pinned_version(requirements: Path = REQUIREMENTS) -> str:
    """The version requirements.txt pins torch to (``torch==X``)."""
    match = re.search(r"^torch==([^\s#]+)", requirements.read_text(), re.M)
    if match is None:
        raise ValueError(f"{requirements} pins no torch==<version>")
    return match[1]


def pip_arguments(build: str, version: str, system: str, cpu_index_reachable: bool) -> tuple[list[str], str]:
    """(what follows ``pip install``, a message for the learner) for one case.

    Args:
        build: "cpu" or "cuda".
        version: the torch version to install.
        system: ``platform.system()``: "Linux", "Darwin", "Windows".
        cpu_index_reachable: whether PyTorch's CPU index answered (only asked on Linux).
    """
    if build not in ("cpu", "cuda"):
        raise ValueError(f"TORCH must be 'cpu' or 'cuda', got {build!r}")
    spec = f"torch=={version}"
    if build == "cuda":
        if system == "Darwin":
            raise ValueError("PyTorch has no CUDA build for macOS: use TORCH=cpu (the default; it uses MPS if present)")
        return [spec], f"installing {spec} from the default index (on Linux and Windows x86-64: the CUDA build)"
    if system != "Linux":
        return [spec], f"installing {spec} from the default index (on {system} that is the CPU build)"
    if cpu_index_reachable:
        return ["--index-url", CPU_INDEX, spec], f"installing {spec}, the CPU build, from {CPU_INDEX}"
    return [spec], (
        f"PyTorch's CPU index ({CPU_INDEX}) cannot be reached from here: installing {spec} from the default index "
        "instead. On a stock Linux pip that is the CUDA build (gigabytes); the build actually installed is "
        "printed below."
    )


def reachable(url: str, timeout: float = 5.0) -> bool:
    """Whether ``url`` answers within ``timeout`` seconds."""
    try:
        with urllib.request.urlopen(url, timeout=timeout):
            return True
    except OSError:
        return False


def installed_build() -> tuple[str, str] | None:
    """(version, "CPU" or "CUDA x.y") of the torch the running Python has, or None without one."""
    probe = "import torch; print(torch.__version__); print(torch.version.cuda or '')"
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    if result.returncode != 0:
        return None
    version, cuda = (result.stdout.splitlines() + [""])[:2]
    return version, (f"CUDA {cuda}" if cuda else "CPU")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build", choices=("cpu", "cuda"), default="cpu")
    args = parser.parse_args(argv)
    version, wanted = pinned_version(), "CPU" if args.build == "cpu" else "CUDA"
    have = installed_build()
    if have is not None and have[0].split("+")[0] == version and have[1].startswith(wanted):
        print(f"torch {have[0]} ({have[1]} build) is installed already")
        return 0
    system = platform.system()
    index_ok = args.build == "cpu" and system == "Linux" and reachable(f"{CPU_INDEX}/torch/")
    arguments, message = pip_arguments(args.build, version, system, index_ok)
    print(message)
    reinstall = ["--force-reinstall"] if have is not None else []  # another build of the same version is there
    subprocess.run([*PIP, *reinstall, *arguments], check=True)
    version_now, build_now = installed_build() or ("none", "no")
    print(f"installed torch {version_now}: the {build_now} build")
    if not build_now.startswith(wanted):
        print(f"note: TORCH={args.build} asked for the {wanted} build; this index served the {build_now} build")
    return 0


if __name__ == "__main__":
    sys.exit(main())
