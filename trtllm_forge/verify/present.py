"""How a verify report looks to a person."""

from __future__ import annotations

from rich.table import Table

from trtllm_forge.verify.check import VerifyReport


def _short(text: str, width: int = 48) -> str:
    flat = text.replace("\n", "⏎")
    return flat if len(flat) <= width else flat[: width - 1] + "…"


def verify_table(report: VerifyReport) -> Table:
    table = Table(title="verify: served vs transformers (greedy)", title_justify="left")
    table.add_column("prompt")
    table.add_column("served (ensemble)")
    table.add_column("transformers")
    table.add_column("tokens equal", justify="right")
    table.add_column("stream = non-stream", justify="center")
    for check in report.checks:
        agreement = check.agreement
        table.add_row(
            _short(check.prompt, 28),
            _short(check.served_text),
            _short(check.reference_text),
            f"{agreement.prefix:.0%}" + ("" if agreement.identical else f" (diverge @{agreement.first_divergence})"),
            "✓" if check.stream_matches else "✗",
        )
    return table


def verify_summary(report: VerifyReport) -> str:
    lines = [
        f"token agreement {report.agreement.prefix:.1%} (positionwise {report.agreement.positionwise:.1%}); "
        f"required {report.min_token_agreement:.0%}"
    ]
    engine, reference = report.engine_perplexity, report.reference_perplexity
    if report.perplexity_increase is not None and engine and reference:
        lines.append(
            f"perplexity: engine {engine.perplexity:.2f} vs reference "
            f"{reference.perplexity:.2f} ({report.perplexity_increase:+.1%}; allowed "
            f"+{report.max_perplexity_increase:.0%})"
        )
    if report.reference_source == "cache":
        lines.append(f"transformers' answers reused from {report.reference_cache} (verify.reference_cache: false recomputes them)")
    lines.append("[green]verify passed[/green]" if report.passed else "[red]verify failed:[/red] " + "; ".join(report.problems))
    return "\n".join(lines)
