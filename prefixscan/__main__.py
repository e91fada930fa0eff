"""`python -m prefixscan` runs the CLI."""

from prefixscan.cli.app import main

main()
