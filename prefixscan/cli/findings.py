"""`prefixscan findings RUN_DIR`: print a run's cache-breaker findings in full (or as JSON)."""

from __future__ import annotations

import typer

from prefixscan.cli.common import handle_errors, json_or_quiet


def finding_kinds(given: list[str], in_run: set[str]) -> set[str]:
    """The kinds `--kind` names, each checked against every kind prefixscan reports (and any in the run): a
    typo must not read as "no cache breaker found". A plural or a hyphen is accepted when it names one kind
    only (timestamps -> timestamp, random-token -> random_token); anything else is a UsageError listing them."""
    from prefixscan.detect.findings import CATEGORIES
    from prefixscan.errors import UsageError

    known = sorted(set(CATEGORIES) | in_run)
    out = set()
    for value in (v.strip() for g in given for v in g.split(",") if v.strip()):
        v = value.lower().replace("-", "_")
        match = [k for k in known if k == v] or [k for k in known if v in (k + "s", k + "es") or v + "s" == k]
        if len(match) != 1:
            raise UsageError(f"--kind {value!r} is not a finding kind; kinds: {', '.join(known)}")
        out.add(match[0])
    return out


def register(app: typer.Typer) -> None:
    """Add the `findings` command to the application."""

    @app.command("findings", no_args_is_help=True)
    @handle_errors
    def findings(
        run_dir: str = typer.Argument(..., help="Run directory written by `prefixscan analyze -o`."),
        kind: list[str] = typer.Option([], "--kind", help="Only these kinds (repeatable or comma-separated), e.g. "
                                                          "timestamp; an unknown kind is an error listing them."),
        tenant: str = typer.Option(None, "--tenant", help="Only this tenant's findings."),
        limit: int = typer.Option(0, "--limit", help="Show at most this many (0: all)."),
        json_out: bool = typer.Option(False, "--json", help="Print findings and counterfactual as JSON on stdout."),
        quiet: bool = typer.Option(False, "--quiet", "-q", help="Print nothing but what --json asks for."),
    ) -> None:
        """List what breaks prefix reuse in the logs: dynamic fields, varying spans, normalisation drift.

        Each finding says where it sits (message, character, token, block), how many requests it affects,
        the prompt tokens of reuse it costs (from a counterfactual re-analysis without it) and the fix. When
        the log has engine-reported cached tokens, a last line splits the gap into prompt breakers, routing,
        eviction and unexplained (the `misses` table); only the first are cache breakers.
        Example: prefixscan findings runs/demo --kind timestamp
        """
        from prefixscan.detect.reader import read_findings, read_miss_attribution, uncheckable

        rows, cf = read_findings(run_dir)
        why_not = uncheckable(run_dir)
        misses = read_miss_attribution(run_dir)
        if kind:
            wanted = finding_kinds(kind, {r["kind"] for r in rows})
            rows = [r for r in rows if r["kind"] in wanted]
        if tenant:
            rows = [r for r in rows if r.get("tenant") == tenant]
        if limit > 0:
            rows = rows[:limit]
        if json_or_quiet(json_out, quiet, {"findings": rows, "checkable": why_not is None, "counterfactual": cf,
                                           "miss_attribution": misses}, default=str):
            return
        if why_not is not None:
            typer.echo(f"Not checkable: run {run_dir} {why_not}, so no cache breaker can be detected.")
            return
        from prefixscan.cli.common import stdout_console
        from prefixscan.report.analyze_terminal import miss_line, render_findings
        from prefixscan.report.fmt import say

        console = stdout_console()
        render_findings(rows, cf, console)
        say(console, miss_line(misses))
