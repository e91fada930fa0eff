"""The package's version, in a module of its own: the library records it in what it writes (the summary,
the manifest) without importing the top-level package, which re-exports the public API and so sits above
every module. Keep it equal to `version` in pyproject.toml."""

__version__ = "0.1.0"
