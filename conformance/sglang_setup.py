"""Unpack SGLang's wheel for the radix-cache driver, without its CUDA dependencies.

`pip install sglang` wants flashinfer, sglang-kernel, CUDA Python and a CUDA torch; the radix tree needs
none of them. So the wheel is downloaded with --no-deps and unpacked into DIR/pkg, and the four pure
packages its import chain needs beyond what the vLLM venv has go to DIR/deps. The driver runs with
PYTHONPATH=DIR/pkg:DIR/deps and conformance/torchvision_stub.py (see there why).

Usage: conformance/.venv/bin/python -m conformance.sglang_setup conformance/.sglang
"""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

SGLANG = "sglang==0.5.23"
DEPS = ("orjson==3.13.0", "ipython==9.18.1", "traitlets==5.16.1", "gguf==0.19.0")


def pip(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "pip", *args, "-q", "--no-deps"], check=True)


def main() -> None:
    out = Path(sys.argv[1])
    wheels = out / "wheel"
    pip("download", SGLANG, "-d", str(wheels))
    (wheel,) = wheels.glob("sglang-*.whl")
    with zipfile.ZipFile(wheel) as z:
        z.extractall(out / "pkg")
    pip("install", "--target", str(out / "deps"), *DEPS)
    wheel.unlink()
    (out / ".installed").touch()
    print(f"{out}: sglang unpacked")


if __name__ == "__main__":
    main()
