"""Command-line interface: one small module per command; each parses options and calls the library."""
