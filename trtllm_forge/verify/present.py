"""How a verify report looks to a person."""

from __future__ import annotations

from rich.table import Table

from trtllm_forge.verify.check import PerplexityCheck, PerplexityStatus, VerifyReport


def _short(text: str, width: int = 48) -> str:
    flat = text.replace("\n", "⏎")
    return flat if len(flat) <= width else flat[: width - 1] + "…"


def _perplexity_row(check: PerplexityCheck) -> tuple[str, str, str, str, str]:
    """The table's last row, in its columns: what, engine, transformers, comparison, verdict."""
    if check.status is not PerplexityStatus.CHECKED or check.engine is None or check.reference is None:
        return ("perplexity", f"{check.status.replace('_', ' ')}: {check.reason}", "", "", "—")
    return (
        f"perplexity ({check.engine.predicted_tokens} tokens)",
        f"{check.engine.perplexity:.2f}",
        f"{check.reference.perplexity:.2f}",
        f"{check.increase:+.1%} (allowed +{check.max_increase:.0%})",
        "✓" if check.within_limit else "✗",
    )


def verify_table(report: VerifyReport) -> Table:
    table = Table(title="verify: served vs transformers (greedy)", title_justify="left")
    table.add_column("prompt")
    table.add_column("served (ensemble)")
    table.add_column("transformers")
    table.add_column("tokens equal", justify="right")
    table.add_column("pass", justify="center")
    for check in report.checks:
        agreement = check.agreement
        table.add_row(
            _short(check.prompt, 28),
            _short(check.served_text),
            _short(check.reference_text),
            f"{agreement.prefix:.0%}" + ("" if agreement.identical else f" (diverge @{agreement.first_divergence})"),
            "✓" if check.stream_matches else "✗ stream ≠ non-stream",
        )
    table.add_section()
    table.add_row(*_perplexity_row(report.perplexity))
    return table


def verify_summary(report: VerifyReport) -> str:
    lines = [
        f"token agreement {report.agreement.prefix:.1%} (positionwise {report.agreement.positionwise:.1%}); "
        f"required {report.min_token_agreement:.0%}"
    ]
    check = report.perplexity
    if check.status is PerplexityStatus.CHECKED and check.engine and check.reference:
        lines.append(
            f"perplexity: engine {check.engine.perplexity:.2f} vs reference {check.reference.perplexity:.2f} "
            f"({check.increase:+.1%}; allowed +{check.max_increase:.0%})"
        )
    elif check.status is PerplexityStatus.NOT_CHECKED:
        lines.append(f"[yellow]perplexity not checked: {check.reason}[/yellow]")
    if report.reference_source == "cache":
        lines.append(f"transformers' answers reused from {report.reference_cache} (verify.reference_cache: false recomputes them)")
    if not report.passed:
        lines.append("[red]verify failed:[/red] " + "; ".join(report.problems))
    elif report.agreement_only:
        lines.append("[yellow]verify passed: the quantized engine was checked on token agreement only[/yellow]")
    else:
        lines.append("[green]verify passed[/green]")
    return "\n".join(lines)
