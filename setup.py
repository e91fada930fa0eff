"""Build hooks; everything else about the build is in pyproject.toml.

- The compiled per-request encode core (prefixscan/encode/_core.c), built with the machine's C compiler at
  install. Optional: where it cannot build, the install goes on and prefixscan runs its pure-Python path,
  with the same output (prefixscan/encode/core.py).
- The canned SQL lives in the top-level `queries/` folder and ships inside the wheel as package data,
  `prefixscan/queries/*.sql`, where `prefixscan.query.queries_dir` finds it.
"""

from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_py import build_py


class BuildPyWithQueries(build_py):
    """build_py, plus a copy of queries/*.sql into the built package (not in editable mode: a checkout reads
    queries/ in place)."""

    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            return
        target = Path(self.build_lib) / "prefixscan" / "queries"
        self.mkpath(str(target))
        for sql in sorted((Path(__file__).resolve().parent / "queries").glob("*.sql")):
            self.copy_file(str(sql), str(target / sql.name))


setup(cmdclass={"build_py": BuildPyWithQueries},
      ext_modules=[Extension("prefixscan.encode._core", ["prefixscan/encode/_core.c"], optional=True,
                             extra_compile_args=["-O2"])])
