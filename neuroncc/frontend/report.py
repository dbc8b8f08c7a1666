"""Pictures and the HTML report of neuroncc-dump: a graph as DOT or SVG (kernels as clusters),
an engine timeline as SVG, and one self-contained HTML file holding them with the stage IR and
the kernel cost table. SVG is drawn here (a layered layout), so no Graphviz is needed; the HTML
loads nothing from the network.
"""

from __future__ import annotations

import functools
import html
from collections import defaultdict
from typing import Any

import jinja2

from neuroncc.codegen.executable.program import Executable
from neuroncc.ir.graph import Graph
from neuroncc.runtime.timing import KernelCost, Schedule

_PALETTE = ("#8ecae6", "#ffb703", "#90be6d", "#f28482", "#cdb4db", "#f6bd60", "#84a59d")


def _label(n_id: int, op: str) -> str:
    return f"%{n_id} {op}"


def graph_dot(g: Graph) -> str:
    lines = [f'digraph "{g.name}" {{', "  rankdir=TB; node [shape=box, fontname=monospace];"]
    for v in g.inputs:
        lines.append(f'  v{v.id} [label="%{v.id}: {v.type}", shape=ellipse];')
    kernel_of = g.kernel_of()
    clusters: dict[int, list[str]] = defaultdict(list)
    for n in g.nodes:
        decl = f'v{n.out.id} [label="{_label(n.out.id, n.op.value)}\\n{n.out.type}"];'
        k = kernel_of.get(n.out.id)
        if k is None:
            lines.append("  " + decl)
        else:
            clusters[k].append(decl)
    for k, decls in clusters.items():
        lines.append(f'  subgraph cluster_{k} {{ label="kernel {k}"; style=filled; ')
        lines.append(f'    color="{_PALETTE[k % len(_PALETTE)]}";')
        lines += [f"    {d}" for d in decls]
        lines.append("  }")
    for n in g.nodes:
        for v in n.inputs:
            lines.append(f"  v{v.id} -> v{n.out.id};")
    for i, v in enumerate(g.outputs):
        lines.append(f'  out{i} [label="output {i}", shape=ellipse]; v{v.id} -> out{i};')
    lines.append("}")
    return "\n".join(lines) + "\n"


def graph_svg(g: Graph) -> str:
    """A layered drawing: each value one layer below its deepest input; kernels shaded."""
    layer: dict[int, int] = {v.id: 0 for v in g.inputs}
    labels: dict[int, str] = {v.id: f"%{v.id}: {v.type}" for v in g.inputs}
    for n in g.nodes:
        layer[n.out.id] = 1 + max((layer[v.id] for v in n.inputs), default=-1)
        labels[n.out.id] = f"{_label(n.out.id, n.op.value)} {n.out.type}"
    rows: dict[int, list[int]] = defaultdict(list)
    for vid, lay in layer.items():
        rows[lay].append(vid)
    w, h, gap_x, gap_y = 210, 26, 20, 34
    pos = {}
    for lay, ids in rows.items():
        for i, vid in enumerate(ids):
            pos[vid] = (10 + i * (w + gap_x), 10 + lay * (h + gap_y))
    width = 20 + max(len(ids) for ids in rows.values()) * (w + gap_x)
    height = 20 + (max(rows) + 1) * (h + gap_y)
    parts = [
        (
            f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
            'font-family="monospace" font-size="11">'
        )
    ]
    kernel_of = g.kernel_of()
    members: dict[int, list[int]] = defaultdict(list)
    for vid, k in kernel_of.items():
        members[k].append(vid)
    for k, ids in sorted(members.items()):
        xs, ys = [pos[i][0] for i in ids], [pos[i][1] for i in ids]
        parts.append(
            f'<rect x="{min(xs) - 6}" y="{min(ys) - 6}" width="{max(xs) - min(xs) + w + 12}" '
            f'height="{max(ys) - min(ys) + h + 12}" rx="8" fill="{_PALETTE[k % len(_PALETTE)]}" '
            f'fill-opacity="0.35"><title>kernel {k}</title></rect>'
        )
    for n in g.nodes:
        x1, y1 = pos[n.out.id]
        for v in n.inputs:
            x0, y0 = pos[v.id]
            parts.append(
                f'<line x1="{x0 + w / 2}" y1="{y0 + h}" x2="{x1 + w / 2}" y2="{y1}" '
                'stroke="#555" stroke-width="1"/>'
            )
    for vid, (x, y) in pos.items():
        fill = "#eeeeee" if vid in {v.id for v in g.inputs} else "#ffffff"
        parts.append(
            f'<rect x="{x}" y="{y}" width="{w}" height="{h}" rx="3" fill="{fill}" stroke="#333"/>'
            f'<text x="{x + 5}" y="{y + 17}">{html.escape(labels[vid][:30])}</text>'
        )
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def timeline_svg(exe: Executable, sched: Schedule, width: int = 1100) -> str:
    """One lane per engine and DMA queue, one bar per instruction, coloured by kernel."""
    tracks = sorted(set(sched.track), key=lambda e: (e.startswith("q"), len(e), e))
    lane = {t: i for i, t in enumerate(tracks)}
    total = max(sched.end, default=0.0) or 1.0
    kernel_of = {}
    for k_index, k in enumerate(exe.kernels):
        for i in range(k.start, k.stop):
            kernel_of[i] = (k_index, k.name)
    lane_h, left = 16, 50
    parts = [
        (
            f'<svg xmlns="http://www.w3.org/2000/svg" width="{width + left}" '
            f'height="{len(tracks) * lane_h + 24}" font-family="monospace" font-size="10">'
        )
    ]
    for t, i in lane.items():
        parts.append(f'<text x="2" y="{i * lane_h + 12}">{t}</text>')
    scale = width / total
    for i, ins in enumerate(exe.instructions):
        k_index, k_name = kernel_of.get(i, (0, ""))
        x = left + sched.start[i] * scale
        bar = max((sched.end[i] - sched.start[i]) * scale, 0.5)
        parts.append(
            f'<rect x="{x:.1f}" y="{lane[ins.engine] * lane_h + 2}" width="{bar:.1f}" '
            f'height="{lane_h - 4}" fill="{_PALETTE[k_index % len(_PALETTE)]}">'
            f"<title>{ins.opcode} ({html.escape(k_name)}) "
            f"{sched.start[i]:.0f}-{sched.end[i]:.0f} ns</title></rect>"
        )
    parts.append(
        f'<text x="{left}" y="{len(tracks) * lane_h + 18}">0</text>'
        f'<text x="{left + width - 80}" y="{len(tracks) * lane_h + 18}">{total / 1e3:.1f} us</text>'
    )
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


_HTML = """<!doctype html>
<html><head><meta charset="utf-8"><title>neuroncc report: {{ title }}</title>
<style>
body { font-family: sans-serif; margin: 1.5em; } pre { background: #f6f6f6; padding: .6em;
overflow-x: auto; font-size: 12px; } table { border-collapse: collapse; font-size: 13px; }
td, th { border: 1px solid #ccc; padding: 2px 8px; text-align: right; }
td:first-child, th:first-child { text-align: left; } .pic { overflow-x: auto; }
</style></head><body>
<h1>neuroncc report: {{ title }}</h1>
{% for g in graphs %}
<h2>{{ g.name }}</h2>
<p>inputs {{ g.inputs }}; simulated {{ g.device_us }} us on {{ g.target }}</p>
{% if g.picture %}<h3>graph ({{ g.picture_stage }}), kernels shaded</h3>
<div class="pic">{{ g.picture | safe }}</div>{% endif %}
{% if g.kernels %}<h3>kernels</h3><table><tr>{% for h in kernel_head %}<th>{{ h }}</th>
{% endfor %}</tr>{% for row in g.kernels %}<tr>{% for c in row %}<td>{{ c }}</td>{% endfor %}
</tr>{% endfor %}</table>{% endif %}
{% if g.timeline %}<h3>engine timeline</h3><div class="pic">{{ g.timeline | safe }}</div>
{% endif %}
<h3>stages</h3>
{% for stage, text in g.stages %}<details><summary>{{ stage }}</summary><pre>{{ text }}</pre>
</details>{% endfor %}
{% endfor %}
</body></html>
"""

KERNEL_HEAD = ("kernel", "engine", "time us", "share", "instr", "MFLOP", "HBM KB", "roofline")


def kernel_rows(costs: list[KernelCost], device_ns: float) -> list[tuple[str, ...]]:
    """The kernel cost table, slowest first."""
    rows = []
    for c in sorted(costs, key=lambda c: -c.ns):
        rows.append(
            (
                c.name,
                c.engine,
                f"{c.ns / 1e3:.2f}",
                f"{c.ns / device_ns:.0%}" if device_ns else "-",
                str(c.instructions),
                f"{c.flops / 1e6:.1f}",
                f"{c.hbm_bytes / 1e3:.1f}",
                f"{c.fraction:.0%}",
            )
        )
    return rows


@functools.cache
def _html_template() -> jinja2.Template:
    return jinja2.Environment(autoescape=True, undefined=jinja2.StrictUndefined).from_string(_HTML)


def html_report(title: str, graphs: list[dict[str, Any]]) -> str:
    """graphs: name, inputs, target, device_us, picture (svg or ""), picture_stage, kernels
    (kernel_rows), timeline (svg or ""), stages [(name, text)]."""
    return _html_template().render(title=title, graphs=graphs, kernel_head=KERNEL_HEAD)
