#!/usr/bin/env python3
"""Writes benchmark reports into docs/benchmarks.md as tables, each stamped with the command
that produced it, the version, the commit and the machine, between the markers

    <!-- bench-tables:begin -->  ...  <!-- bench-tables:end -->

so the page's tables are regenerated, never edited by hand (`make bench-docs`). With --readme,
the README's Benchmarks section gets a summary between `<!-- bench-summary:begin -->` and
`<!-- bench-summary:end -->`: every phase of the --bench reports, its time against the physical
limit and its CPU per GiB against the floor, and the --python reports' race against torch DCP.

  bench_tables.py --page docs/benchmarks.md [--readme README.md] [--bench REPORT.json:"COMMAND"]...
      [--simulate REPORT.json:"COMMAND"]... [--python REPORT.json:"COMMAND"]...

--bench: `dcp bench --json` reports, one table each (with the incremental and memory tier
summaries when those phases ran); --simulate: `dcp simulate --json` reports, one table for all;
--python: `python -m hyperdcp.bench --json` reports, one table each.
"""

import argparse
import json
import os
import platform
import subprocess
from pathlib import Path

BEGIN, END = "<!-- bench-tables:begin -->", "<!-- bench-tables:end -->"
SUMMARY_BEGIN, SUMMARY_END = "<!-- bench-summary:begin -->", "<!-- bench-summary:end -->"


def machine() -> str:
    model = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
        mem_kib = int(next(l for l in Path("/proc/meminfo").read_text().splitlines()
                           if l.startswith("MemTotal")).split()[1])
    except (OSError, StopIteration, ValueError):
        mem_kib = 0
    return (f"{os.cpu_count()} CPUs ({model}), {mem_kib / 2**20:.0f} GiB, "
            f"Linux {platform.release()}")


def stamp(root: Path, command: str) -> str:
    version = (root / "VERSION").read_text().strip() if (root / "VERSION").exists() else "?"
    try:
        commit = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"],
                                capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        commit = "?"
    return f"`{command}` — dcp {version}, commit {commit}, {machine()}"


def gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def bench_table(report: dict) -> str:
    ref = report.get("reference", {})
    head = (f"{report.get('workload')} ({report.get('layers')} layers, width x"
            f"{report.get('width_scale')}), {report.get('unique_bytes', 0) / 2**20:.1f} MiB "
            f"unique, {report.get('ranks')} ranks ({report.get('backend')}), cache "
            f"{report.get('cache')}, median of {report.get('repeat')}; references: write "
            f"{ref.get('write_gib_per_s', 0):.2f} GiB/s, read cold "
            f"{ref.get('read_cold_gib_per_s', 0):.2f}, read warm "
            f"{ref.get('read_warm_gib_per_s', 0):.2f}, memcpy {ref.get('memcpy_gib_per_s', 0):.2f}")
    if report.get("storage_throttle"):
        head += f"; reads capped at {report['storage_throttle'].get('gib_per_s')} GiB/s"
    if report.get("tier"):
        t = report["tier"]
        head += (f"; memory tier on {t.get('hosts')} hosts, {t.get('replicas')} replica(s)"
                 f"{', the last host lost before each restore' if t.get('host_lost') else ''}")
    rows = ["| phase | layout | seconds | GiB/s | reference | ratio | CPU / floor |",
            "|---|---|---:|---:|---|---:|---:|"]
    phases = report.get("phases", {})
    for name, p in phases.items():
        cpu = p.get("cpu_ratio_to_floor")
        rows.append(f"| {name} | {p.get('layout', '')} | {p.get('seconds', 0):.3f} | "
                    f"{p.get('gib_per_s', 0):.2f} | {p.get('reference', '')} | "
                    f"{p.get('ratio_to_reference', 0):.2f} | "
                    f"{f'{cpu:.2f}' if cpu else '-'} |")
    lines = []
    inc, full = phases.get("incremental.save"), phases.get("incremental.full_save")
    if inc and full and inc.get("bytes_changed"):
        lines.append(f"Incremental: {gib(inc['bytes_changed'])} of "
                     f"{gib(report.get('unique_bytes', 0))} changed; the save wrote "
                     f"{inc['bytes_written'] / inc['bytes_changed']:.3f}x the changed bytes in "
                     f"1/{full['seconds'] / inc['seconds']:.1f} of the full save's time.")
        lf, li = phases.get("incremental.load_full"), phases.get("incremental.load")
        if lf and li:
            lines.append(f"Load of the incremental step / of the full one: "
                         f"{li['seconds'] / lf['seconds']:.2f}x.")
    mem, root = phases.get("tier.restore_memory"), phases.get("tier.restore_root")
    if mem and root:
        lines.append(f"Memory tier: restore from memory {root['seconds'] / mem['seconds']:.2f}x "
                     f"faster than from the root; a tier save blocked the caller "
                     f"{phases.get('tier.save', {}).get('blocked_ratio_to_memcpy', 0):.2f}x "
                     f"a memcpy of the staged bytes.")
    return head + "\n\n" + "\n".join(rows) + ("\n\n" + " ".join(lines) if lines else "")


def spread(d: dict) -> str:
    mean = d.get("mean", 0)
    return f"{d.get('max', 0) / mean:.2f}" if mean else "-"


def simulate_table(reports) -> str:
    rows = ["| job | ranks | stored chunks | save max/mean | load max/mean | collectives per "
            "rank (groups) | all-gathers | metadata (encode / decode s) | PlanBroadcast s | "
            "command |", "|---|---:|---:|---:|---:|---:|---:|---|---:|---|"]
    for r, command in reports:
        save, load, md = r.get("save", {}), r.get("load", {}), r.get("metadata", {})
        b = load.get("broadcast") or {}
        job = (f"{r.get('workload')}{' + optimizer' if r.get('optimizer') else ''}, "
               f"{r.get('save_layout')} -> {r.get('load_layout')}")
        rows.append(
            f"| {job} | {r.get('ranks'):,} | {r.get('chunks', 0):,} | "
            f"{spread(save.get('bytes_written_per_rank', {}))} | "
            f"{spread(b.get('read_bytes_per_rank', {}))} | "
            f"{b.get('collectives_per_rank', {}).get('max', 0)} "
            f"({b.get('groups_per_rank', {}).get('max', 0)}) | {b.get('gathers', 0)} | "
            f"{md.get('bytes', 0) / 1e6:.1f} MB ({md.get('encode_seconds', 0):.3f} / "
            f"{md.get('decode_seconds', 0):.3f}) | {b.get('plan_seconds', 0):.2f} | "
            f"`{command}` |")
    return "\n".join(rows)


def python_table(report: dict) -> str:
    head = (f"{report.get('ranks')} ranks ({report.get('backend')}), {report.get('tensors')} "
            f"tensors, {report.get('unique_bytes', 0) / 2**20:.0f} MiB unique, torch "
            f"{report.get('torch_version')}, median of {report.get('repeat')}")
    rows = ["| phase | hyperdcp s | torch DCP s | torch / hyperdcp |", "|---|---:|---:|---:|"]
    for name, p in report.get("phases", {}).items():
        rows.append(f"| {name} | {p['dcp_seconds']:.3f} | {p['torch_seconds']:.3f} | "
                    f"{p['ratio_torch_over_dcp']:.2f}x |")
    return head + "\n\n" + "\n".join(rows)


def summary_table(reports) -> str:
    """One row per phase of every report: wall clock against the run's reference, CPU
    seconds per GiB (all ranks) against the floor measured in the same run."""
    rows = ["| run | phase | seconds | x reference | CPU s/GiB | floor CPU s/GiB | "
            "CPU / floor |", "|---|---|---:|---:|---:|---:|---:|"]
    for report, _ in reports:
        run = (f"{report.get('ranks')} ranks, {report.get('save_layout')}"
               f"{', reads capped' if report.get('storage_throttle') else ''}"
               f"{', %s hosts' % report['tier'].get('hosts') if report.get('tier') else ''}")
        for name, p in report.get("phases", {}).items():
            cpu, floor = p.get("cpu_seconds_per_gib"), p.get("floor_cpu_seconds_per_gib")
            ratio = p.get("cpu_ratio_to_floor")
            rows.append(f"| {run} | {name} ({p.get('layout', '')}) | {p.get('seconds', 0):.3f} | "
                        f"{p.get('ratio_to_reference', 0):.2f} | "
                        f"{f'{cpu:.2f}' if cpu else '-'} | {f'{floor:.2f}' if floor else '-'} | "
                        f"{f'{ratio:.2f}' if ratio else '-'} |")
    return "\n".join(rows)


def replace_block(text: str, begin: str, end: str, block: str, heading: str) -> str:
    """`block` between the markers, or appended under `heading` when the page has neither; a
    page with one marker, several, or the end before the begin is refused, not rewritten."""
    block = begin + "\n" + block + "\n" + end
    found = (text.count(begin), text.count(end))
    if found == (0, 0):
        return text.rstrip("\n") + f"\n\n{heading}\n\n" + block + "\n"
    if found != (1, 1) or text.index(end) < text.index(begin):
        raise SystemExit(f"bench_tables: expected one {begin} before one {end}")
    return text[:text.index(begin)] + block + text[text.index(end) + len(end):]


def load_specs(specs):
    out = []
    for spec in specs or []:
        path, _, command = spec.partition(":")
        out.append((json.loads(Path(path).read_text()), command or f"... --json {path}"))
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--page", required=True)
    ap.add_argument("--readme")
    ap.add_argument("--bench", action="append", help='REPORT.json:"the command that wrote it"')
    ap.add_argument("--simulate", action="append")
    ap.add_argument("--python", action="append")
    a = ap.parse_args()
    page = Path(a.page)
    root = page.resolve().parent.parent
    parts = ["Written by `scripts/bench_tables.py` from the runs' JSON reports (`make "
             "bench-docs`). ratio = seconds / the same run's reference (1.00 = at the physical "
             "limit); CPU / floor = the ranks' CPU time over what the references spent on the "
             "same bytes plus one hash pass."]
    for report, command in load_specs(a.bench):
        parts.append(stamp(root, command) + "\n\n" + bench_table(report))
    sims = load_specs(a.simulate)
    if sims:
        parts.append(stamp(root, "dcp simulate (each job's command in its row)") + "\n\n" +
                     simulate_table(sims))
    for report, command in load_specs(a.python):
        parts.append(stamp(root, command) + "\n\n" + python_table(report))
    page.write_text(replace_block(page.read_text(), BEGIN, END, "\n\n".join(parts),
                                  "## Current tables"))
    if a.readme:
        benches, pythons = load_specs(a.bench), load_specs(a.python)
        summary = []
        if benches:
            summary.append("\n".join(f"- {stamp(root, c)}" for _, c in benches) + "\n\n" +
                           summary_table(benches))
        for report, command in pythons:
            summary.append(stamp(root, command) + "\n\n" + python_table(report))
        readme = Path(a.readme)
        readme.write_text(replace_block(readme.read_text(), SUMMARY_BEGIN, SUMMARY_END,
                                        "\n\n".join(summary), "## Benchmarks"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
