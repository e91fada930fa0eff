"""Reporters: render results objects (terminal, Markdown, HTML); they never recompute."""
