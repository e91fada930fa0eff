"""Build hook: the canned SQL lives in the top-level `queries/` folder (the design card's layout) and ships inside
the wheel as package data, `prefixscan/queries/*.sql`, where `prefixscan.query.queries_dir` finds it. Everything
else about the build is in pyproject.toml."""

from pathlib import Path

from setuptools import setup
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


setup(cmdclass={"build_py": BuildPyWithQueries})
