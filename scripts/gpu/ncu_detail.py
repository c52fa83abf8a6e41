#!/usr/bin/env python3
"""What limits the small kernels of a frame: Nsight Compute's section metrics by kernel.

    python3 scripts/gpu/ncu_detail.py NCU_DETAILS_CSV

NCU_DETAILS_CSV is what `ncu --section ... --csv --page details --print-units base` wrote
(scripts/gpu/run.sh detail). Launches of one kernel name are averaged; the table keeps the
metrics that say whether a kernel is short of work (waves, occupancy), of issue (IPC) or of
memory (DRAM and L2). Every metric name the report held is listed at the end, for the next
question.
"""

import csv
import re
import sys
from collections import defaultdict

# (column title, ncu metric name), in the order printed.
COLUMNS = [
    ("us", "Duration"),
    ("grid", "Grid Size"),
    ("block", "Block Size"),
    ("waves/SM", "Waves Per SM"),
    ("regs", "Registers Per Thread"),
    ("occupancy % (theory)", "Theoretical Occupancy"),
    ("occupancy % (achieved)", "Achieved Occupancy"),
    ("SM %", "Compute (SM) Throughput"),
    ("memory %", "Memory Throughput"),
    ("DRAM %", "DRAM Throughput"),
    ("L2 hit %", "L2 Hit Rate"),
    ("IPC", "Executed Ipc Active"),
    ("issue busy %", "Issue Slots Busy"),
]


def number(text):
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return None


def main(path):
    with open(path, newline="") as f:
        rows = list(csv.reader(l for l in f if l.startswith('"')))
    header_at = next((i for i, r in enumerate(rows) if "Kernel Name" in r and "Metric Name" in r),
                     None)
    if header_at is None:
        sys.exit(f"{path}: no ncu details CSV header")
    col = {name: i for i, name in enumerate(rows[header_at])}
    sums = defaultdict(lambda: defaultdict(list))
    launches = defaultdict(set)
    seen = {}
    for r in rows[header_at + 1:]:
        # Metric rows stop after the value; only rule rows fill the rule columns.
        if len(r) <= col["Metric Value"]:
            continue
        name = re.sub(r"^void\s+", "", r[col["Kernel Name"]]).split("(")[0].strip()[:60]
        metric, unit, value = r[col["Metric Name"]], r[col["Metric Unit"]], r[col["Metric Value"]]
        # One name may come in two sections with two units ("Memory Throughput": % of peak in
        # the speed of light, bytes a second in the memory workload): the first unit seen keeps
        # the name, the other gets its unit appended.
        first = seen.setdefault(metric, (r[col["Section Name"]], unit))
        if first[1] != unit:
            metric = f"{metric} ({unit})"
            seen.setdefault(metric, (r[col["Section Name"]], unit))
        launches[name].add(r[col["ID"]])
        v = number(value)
        if v is None:
            continue
        if metric == "Duration":
            v = v / 1e3 if unit in ("ns", "nsecond") else v
        sums[name][metric].append(v)
    if not sums:
        sys.exit(f"{path}: no kernel rows")
    print(f"Nsight Compute sections, {sum(len(v) for v in launches.values())} launches "
          f"(profiler clocks, caches flushed); means over each kernel's launches")
    print()
    print("| kernel | launches | " + " | ".join(c for c, _ in COLUMNS) + " |")
    print("|---|---|" + "---|" * len(COLUMNS))
    order = sorted(sums, key=lambda n: -sum(sums[n].get("Duration", [0])))
    for name in order:
        cells = []
        for _, metric in COLUMNS:
            vals = sums[name].get(metric)
            cells.append("-" if not vals else f"{sum(vals) / len(vals):.1f}")
        print(f"| {name} | {len(launches[name])} | " + " | ".join(cells) + " |")
    print()
    print("Metrics in the report: " + "; ".join(
        f"{m} ({s}, {u})" if u else f"{m} ({s})" for m, (s, u) in sorted(seen.items())),
        file=sys.stderr)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: ncu_detail.py NCU_DETAILS_CSV")
    main(sys.argv[1])
