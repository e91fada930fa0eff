"""`prefixscan synth`: write a deterministic synthetic request log with a ground-truth sidecar."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    """Add the `synth` command to the application."""

    @app.command("synth")
    def synth() -> None:
        """Generate a synthetic request log with ground truth (placeholder)."""
        typer.echo("synth: not implemented yet", err=True)
        raise typer.Exit(1)
