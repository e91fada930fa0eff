"""The compiled per-request encode core (prefixscan/_encode_core.c), built with the machine's C compiler at
install. Optional: where it cannot build, the install goes on and prefixscan runs its pure-Python path,
with the same output (prefixscan/encode_core.py). Everything else is declared in pyproject.toml."""

from setuptools import Extension, setup

setup(ext_modules=[Extension("prefixscan._encode_core", ["prefixscan/_encode_core.c"], optional=True,
                             extra_compile_args=["-O2"])])
