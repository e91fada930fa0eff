"""`python -m prefixscan` runs the CLI."""

from prefixscan.cli.app import main

if __name__ == "__main__":  # encode workers are spawned: they import this module without running the CLI
    main()
