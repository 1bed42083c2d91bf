#!/usr/bin/env python3
"""Writes `dcp bench --json` reports into docs/benchmarks.md as tables, each stamped with the
command that produced it, the version, the commit and the machine, between the markers

    <!-- bench-tables:begin -->  ...  <!-- bench-tables:end -->

so the page's current tables are regenerated, never edited by hand (`make bench-docs`).

  bench_tables.py --page docs/benchmarks.md REPORT.json:"COMMAND" [REPORT.json:"COMMAND" ...]
"""

import argparse
import json
import os
import platform
import subprocess
from pathlib import Path

BEGIN, END = "<!-- bench-tables:begin -->", "<!-- bench-tables:end -->"


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


def table(report: dict) -> str:
    ref = report.get("reference", {})
    head = (f"{report.get('workload')} ({report.get('layers')} layers, width x"
            f"{report.get('width_scale')}), {report.get('unique_bytes', 0) / 2**20:.1f} MiB "
            f"unique, {report.get('ranks')} ranks ({report.get('backend')}), cache "
            f"{report.get('cache')}, median of {report.get('repeat')}; references: write "
            f"{ref.get('write_gib_per_s', 0):.2f} GiB/s, read cold "
            f"{ref.get('read_cold_gib_per_s', 0):.2f}, read warm "
            f"{ref.get('read_warm_gib_per_s', 0):.2f}, memcpy {ref.get('memcpy_gib_per_s', 0):.2f}")
    rows = ["| phase | layout | seconds | GiB/s | reference | ratio |", "|---|---|---:|---:|---|---:|"]
    for name, p in report.get("phases", {}).items():
        rows.append(f"| {name} | {p.get('layout', '')} | {p.get('seconds', 0):.3f} | "
                    f"{p.get('gib_per_s', 0):.2f} | {p.get('reference', '')} | "
                    f"{p.get('ratio_to_reference', 0):.2f} |")
    if report.get("storage_throttle"):
        head += f"; reads capped at {report['storage_throttle'].get('gib_per_s')} GiB/s"
    return head + "\n\n" + "\n".join(rows)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--page", required=True)
    ap.add_argument("reports", nargs="+", help='REPORT.json:"the command that wrote it"')
    a = ap.parse_args()
    page = Path(a.page)
    root = page.resolve().parent.parent
    parts = ["The current tables, written by `scripts/bench_tables.py` from the runs' JSON "
             "reports; ratio = seconds / the same run's reference (1.00 = at the physical "
             "limit)."]
    for spec in a.reports:
        path, _, command = spec.partition(":")
        report = json.loads(Path(path).read_text())
        parts.append(stamp(root, command or f"dcp bench ... --json {path}") + "\n\n" +
                     table(report))
    text = page.read_text()
    block = BEGIN + "\n" + "\n\n".join(parts) + "\n" + END
    if BEGIN in text and END in text:
        text = text[:text.index(BEGIN)] + block + text[text.index(END) + len(END):]
    else:
        text = text.rstrip("\n") + "\n\n## Current tables\n\n" + block + "\n"
    page.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
