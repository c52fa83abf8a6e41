#!/usr/bin/env python3
"""The short table of a round of GPU measurements (scripts/gpu/run.sh), from its log folder.

    python3 scripts/gpu/summary.py LOG_DIR

Reads what the steps left there: e2e-LABEL-BUILD-ROUND.json (bench e2e), attention-BUILD.json
(bench attention), anchor-attention.jsonl and anchor-e2e.jsonl (the reference's anchors),
e2e-10k.json and steps.log (the tests' lines). Prints markdown tables; where the reference's
end-to-end median is there, each e2e median is also given as a ratio to it.
"""

import json
import re
import sys
from collections import defaultdict
from pathlib import Path
from statistics import median


def load_json(path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as e:
        print(f"{path.name}: unreadable ({e})")
        return None


def json_lines(path):
    rows = []
    if not path.exists():
        return rows
    for line in path.read_text().splitlines():
        line = line.strip()
        if line.startswith("{"):
            try:
                rows.append(json.loads(line))
            except ValueError:
                pass
    return rows


def fmt(v, digits=2):
    return "—" if v is None else f"{v:.{digits}f}"


def main(logs):
    out = []
    build = logs / "BUILD"
    if build.exists():
        out += ["```", build.read_text().strip(), "```", ""]

    steps = logs / "steps.log"
    if steps.exists():
        tests = [l.split(" ", 2)[2] for l in steps.read_text().splitlines() if " test" in l]
        if tests:
            out += ["GPU tests:", ""] + [f"- {t}" for t in tests] + [""]

    reference = None
    for row in json_lines(logs / "anchor-e2e.jsonl"):
        if row.get("config", "").startswith("fi_compile") and "median_ms" in row:
            reference = row
        elif "error" in row:
            out.append(f"reference {row.get('config')}: {row['error'][:300]}")
    if reference:
        out += [
            f"Reference (FlashInfer + torch.compile): median {reference['median_ms']:.2f} ms, "
            f"p10 {reference.get('p10_ms', float('nan')):.2f}, "
            f"p90 {reference.get('p90_ms', float('nan')):.2f} "
            f"({reference.get('steady_frames', '?')} steady frames)",
            "",
        ]

    runs = defaultdict(list)
    for path in sorted(logs.glob("e2e-*-*-*.json")):
        m = re.fullmatch(r"e2e-(.+)-(streamrecon|baseline|variant)-(\d+)\.json", path.name)
        report = load_json(path) if m else None
        if report:
            runs[(m.group(1), m.group(2))].append(report)
    if runs:
        out += [
            "| run | build | period ms (each round) | aggregator | between aggregators | heads "
            "| DINO | vs reference |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for (label, build_name), reports in sorted(runs.items()):
            periods = [r["median_period_ms"] for r in reports]
            parts = [r.get("median_parts", {}) for r in reports]

            def part(key):
                vals = [p[key] for p in parts if p.get(key) is not None]
                return median(vals) if vals else None

            ratio = (
                f"{reference['median_ms'] / median(periods):.2f}x"
                if reference
                else "—"
            )
            out.append(
                f"| {label} | {build_name} | {', '.join(fmt(p) for p in periods)} "
                f"| {fmt(part('aggregator_ms'))} | {fmt(part('between_aggregators_ms'))} "
                f"| {fmt(part('heads_ms'))} | {fmt(part('dino_ms'))} | {ratio} |"
            )
        out.append("")

    for path in sorted(logs.glob("attention-*.json")):
        report = load_json(path)
        if not report:
            continue
        out += [
            f"bench attention ({path.stem}):",
            "",
            "| case | kernel | splits | ms | TFLOP/s | error |",
            "|---|---|---|---|---|---|",
        ]
        for c in report.get("cases", []):
            case = f"{c['live_frames']}/{c['frames_seen']}"
            out.append(
                f"| {case} | {c['kernel']} | {c['splits']} | {c['paged_ms']:.3f} "
                f"| {c['paged_tflops']:.0f} | {c['paged_rel_err']:.1e} |"
            )
            log2 = c.get("log2_queries")
            if log2:
                out.append(
                    f"| {case} log2 form | {log2['kernel']} | {log2['splits']} | {log2['ms']:.3f} "
                    f"| {log2['tflops']:.0f} | {log2['rel_err']:.1e} |"
                )
        out.append("")

    anchor = json_lines(logs / "anchor-attention.jsonl")
    if anchor:
        out += ["Attention anchor:", "", "| case | SDPA dense ms (TFLOP/s) | FlashInfer ms (TFLOP/s) |",
                "|---|---|---|"]
        for row in (r for r in anchor if "live" in r):
            fi = f"{row['fi_ms']:.3f} ({row['fi_tflops']:.0f})" if "fi_ms" in row else "—"
            out.append(
                f"| {row['live']}/{row['total_frames']} | {row['sdpa_dense_ms']:.3f} "
                f"({row['sdpa_dense_tflops']:.0f}) | {fi} |"
            )
        ceilings = [
            f"{key.replace('ceiling_', '').replace('_', ' ')} {value:.1f}"
            for row in anchor
            for key, value in row.items()
            if key.startswith("ceiling_")
        ]
        if ceilings:
            out += ["", "Ceilings in this call: " + ", ".join(ceilings)]
        out.append("")

    long_run = logs / "e2e-10k.json"
    if long_run.exists():
        report = load_json(long_run)
        if report:
            out += ["10,000 frames: mean period around each mark (ms):", ""]
            out.append(
                " ".join(
                    f"{g['streaming_frame']}: {g['mean_period_ms']:.2f};"
                    for g in report.get("growth", [])
                )
            )
            out.append("")
    print("\n".join(out) if out else "nothing measured")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: summary.py LOG_DIR")
    main(Path(sys.argv[1]))
