"""Text and HTML views of a :class:`tvm_ext.inspect.Report`.

Every name that comes from the model (op, group, kernel, reason) is HTML-escaped in the
HTML view.
"""
from __future__ import annotations

import html
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover - typing only
    from .report import Report


def human_bytes(n: float) -> str:
    """``1536`` -> ``'1.50 KiB'``."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024 or unit == "GiB":
            return f"{int(value)} B" if unit == "B" else f"{value:.2f} {unit}"
        value /= 1024
    return f"{value:.2f} GiB"  # pragma: no cover - loop always returns


def human_flops(n: float) -> str:
    """``2.5e9`` -> ``'2.50 GFLOP'``."""
    value = float(n)
    for unit in ("", "K", "M", "G", "T"):
        if abs(value) < 1000 or unit == "T":
            return f"{int(value)} FLOP" if not unit else f"{value:.2f} {unit}FLOP"
        value /= 1000
    return f"{value:.2f} TFLOP"  # pragma: no cover - loop always returns


def human_seconds(s: float) -> str:
    """``1.5e-5`` -> ``'15.00 us'`` (s, ms, us or ns)."""
    if s >= 1:
        return f"{s:.2f} s"
    if s >= 1e-3:
        return f"{s * 1e3:.2f} ms"
    if s >= 1e-6:
        return f"{s * 1e6:.2f} us"
    return f"{s * 1e9:.1f} ns"


def _by_generator(report: "Report") -> str:
    counts: dict[str, int] = {}
    for k in report.launches:
        counts[k.generator] = counts.get(k.generator, 0) + k.launches
    return ", ".join(f"{g} {n}" for g, n in sorted(counts.items(), key=lambda item: -item[1])) or "none"


def _sources(report: "Report") -> str:
    counts: dict[str, int] = {}
    for k in report.launches:
        if k.cost_source:
            counts[k.cost_source] = counts.get(k.cost_source, 0) + k.launches
    return ", ".join(f"{s} {n}" for s, n in sorted(counts.items())) or "not priced"


def _selection(report: "Report") -> str:
    """Candidates proposed and chosen per generator, dropped ones, solver notes (all functions)."""
    proposed: dict[str, int] = {}
    chosen: dict[str, int] = {}
    dropped, notes = 0, []
    for entry in report.selection.values():
        for key, into in (("proposed", proposed), ("chosen", chosen)):
            for g, n in entry.get(key, {}).items():
                into[g] = into.get(g, 0) + n
        dropped += len(entry.get("dropped", []))
        notes.extend(entry.get("notes", []))
    if not proposed:
        return "none (TVM's FuseOps)"

    def counts(d: dict[str, int]) -> str:
        return ", ".join(f"{g} {n}" for g, n in sorted(d.items()))
    text = f"{sum(chosen.values())} of {sum(proposed.values())} candidates ({counts(proposed)}) chosen: {counts(chosen)}"
    if dropped:
        text += f"; {dropped} dropped (see selection in --json)"
    return text + "".join(f"; {n}" for n in dict.fromkeys(notes))


def _planning(report: "Report") -> str:
    """Seconds each generator took to propose (all functions), slowest first; a planning budget
    that ran out says so in the kernel selection line."""
    seconds: dict[str, float] = {}
    for entry in report.selection.values():
        for g, s in entry.get("generator_seconds", {}).items():
            seconds[g] = seconds.get(g, 0.0) + s
    return ", ".join(f"{g} {s:.1f} s" for g, s in sorted(seconds.items(), key=lambda item: -item[1]) if s >= 0.05) or "-"


def summary_lines(report: "Report") -> list[tuple[str, str]]:
    """(label, value) pairs shown above the tables."""
    return [
        ("model", report.model),
        ("preset", report.preset),
        ("target", report.target),
        ("device", report.device),
        ("kernel launches / inference", f"{report.kernels} ({_by_generator(report)})"),
        ("distinct kernels (__global__)", str(report.distinct_kernels)),
        ("kernel selection", _selection(report)),
        ("fused groups", str(len(report.groups))),
        ("modelled global traffic", f"{human_bytes(report.traffic_bytes)} (whole model as one kernel "
                                     f"{human_bytes(report.min_traffic_bytes)}, unfused {human_bytes(report.unfused_traffic_bytes)})"),
        ("flops", f"{human_flops(report.flops)} ({report.dtype})"),
        ("modelled time / inference", f"{human_seconds(report.modelled_time_s)} (cost model, {_sources(report)})"),
        ("roofline lower bound (modelled)",
         f"{human_seconds(report.roofline_bound_s)} (compute {human_seconds(report.roofline_compute_s)}, "
         f"memory {human_seconds(report.roofline_memory_s)})"),
        ("fallback ops", str(len(report.fallback_ops))),
        ("compile time", human_seconds(report.compile_seconds)),
        ("planning time by generator", _planning(report)),
        ("registers and spills", _ptxas(report)),
    ]


def _ptxas(report: Report) -> str:
    facts = getattr(report.build, "ptxas", None)
    return facts.summary() if facts is not None else "not compiled (CPU build, or the preset's ptxas is off)"


def _group_rows(report: "Report") -> list[list[str]]:
    return [[str(i), g.name, " + ".join(g.ops), ",".join(sorted(set(g.op_classes))), human_flops(g.flops),
             human_bytes(g.traffic_bytes), str(g.kernels)] for i, g in enumerate(report.groups)]


_GROUP_HEAD = ["#", "group", "ops", "classes", "flops", "traffic", "kernels"]
_LAUNCH_HEAD = ["kernel", "generator", "calls", "kernels/call", "launches", "modelled/call", "cost", "schedule rule",
                "plan"]
_FALLBACK_HEAD = ["op", "kind", "reason"]


def _launch_rows(report: "Report") -> list[list[str]]:
    return [[k.func, k.generator, str(k.calls), str(k.kernels_per_call), str(k.launches),
             "-" if k.modelled_s is None else human_seconds(k.modelled_s), k.cost_source or "-", k.rule or "-",
             k.plan or "-"] for k in report.launches]


def _fallback_rows(report: "Report") -> list[list[str]]:
    return [[f.op + (f" ({' + '.join(f.ops)})" if f.ops else ""), f.kind, f.reason] for f in report.fallback_ops]


def text_table(head: list[str], rows: list[list[str]], max_width: int = 60) -> str:
    """A plain aligned table; cells longer than ``max_width`` are cut with '...'."""
    cut = [[c if len(c) <= max_width else c[: max_width - 3] + "..." for c in row] for row in [head] + rows]
    widths = [max(len(row[i]) for row in cut) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in cut]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def report_table(report: "Report") -> str:
    """The whole report as text."""
    label_width = max(len(label) for label, _ in summary_lines(report))
    parts = ["\n".join(f"{label.ljust(label_width)}  {value}" for label, value in summary_lines(report)),
             "fused groups:\n" + text_table(_GROUP_HEAD, _group_rows(report)),
             "kernel launches:\n" + text_table(_LAUNCH_HEAD, _launch_rows(report))]
    if report.fallback_ops:
        parts.append("left to default lowering:\n" + text_table(_FALLBACK_HEAD, _fallback_rows(report), 120))
    else:
        parts.append("left to default lowering: none")
    return "\n\n".join(parts)


def _html_table(head: list[str], rows: list[list[str]]) -> str:
    esc = html.escape
    header = "".join(f"<th>{esc(h)}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{esc(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{header}</tr></thead><tbody>{body}</tbody></table>"


def report_html(report: "Report") -> str:
    """The whole report as an HTML fragment (for notebooks)."""
    esc = html.escape
    summary = "".join(f"<tr><th style='text-align:left'>{esc(k)}</th><td>{esc(v)}</td></tr>"
                      for k, v in summary_lines(report))
    pictures = []
    if report.build is not None:
        from .pictures import graph_svg, kernel_chart_svg

        pictures = ["<h4>modelled time by kernel</h4>", kernel_chart_svg(report),
                    "<h4>kernels on the operator graph (colour: generator)</h4>", graph_svg(report)]
    parts = [f"<div class='tvm-ext-report'><table>{summary}</table>", *pictures,
             "<h4>fused groups</h4>", _html_table(_GROUP_HEAD, _group_rows(report)),
             "<h4>kernel launches</h4>", _html_table(_LAUNCH_HEAD, _launch_rows(report)),
             "<h4>left to default lowering</h4>",
             _html_table(_FALLBACK_HEAD, _fallback_rows(report)) if report.fallback_ops else "<p>none</p>",
             "</div>"]
    return "".join(parts)
