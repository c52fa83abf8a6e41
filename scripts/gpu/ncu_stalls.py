#!/usr/bin/env python3
"""Why a kernel waits: Nsight Compute's full set, tabled per kernel from its raw metrics.

    python3 scripts/gpu/ncu_stalls.py NCU_RAW_CSV [NCU_RAW_CSV ...]

Each NCU_RAW_CSV is what `ncu --set full --csv --page raw --print-units base` wrote
(scripts/gpu/run.sh stalls: the first launches of one kernel family in a steady frame). Launches
of one kernel name are averaged (each launch's duration and grid are listed, since one entry point
may serve several shapes, as the camera head's sweep does). Per kernel: duration, issue activity, the tensor, FMA and
exponential pipes, memory, occupancy, and the warp stall reasons in cycles per issued
instruction, largest first (what a warp waits on between two of its instructions).
"""

import csv
import re
import sys
from collections import defaultdict

# (title, metric) printed first when the report has them.
SUMMARY = [
    ("us", "gpu__time_duration.sum"),
    ("SM busy %", "sm__throughput.avg.pct_of_peak_sustained_elapsed"),
    ("issue active %", "sm__inst_issued.avg.pct_of_peak_sustained_active"),
    ("tensor pipe %", "sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active"),
    ("tensor pipe (hmma) %", "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active"),
    ("FMA pipe %", "sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active"),
    ("XU pipe %", "sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active"),
    ("DRAM %", "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed"),
    ("L2 %", "lts__t_sectors.avg.pct_of_peak_sustained_elapsed"),
    ("occupancy % achieved", "sm__warps_active.avg.pct_of_peak_sustained_active"),
    ("warp cycles / issue", "smsp__average_warp_latency_per_inst_issued.ratio"),
]
STALL = re.compile(r"^smsp__average_warp_latency_issue_stalled_(\w+)\.ratio$")
STALL_ALT = re.compile(r"^smsp__average_warps_issue_stalled_(\w+)_per_issue_active\.ratio$")


def number(text):
    try:
        return float(text.replace(",", ""))
    except (ValueError, AttributeError):
        return None


def read(path, sums, launches, shapes):
    with open(path, newline="") as f:
        rows = list(csv.reader(l for l in f if l.startswith('"')))
    if len(rows) < 2:
        return
    header = rows[0]
    # The second row holds the units; launches follow.
    body = rows[2:] if rows[1] and rows[1][0] == "" else rows[1:]
    col = {name: i for i, name in enumerate(header)}
    name_at = col.get("Kernel Name")
    if name_at is None:
        sys.exit(f"{path}: no Kernel Name column")
    for r in body:
        if len(r) != len(header):
            continue
        name = re.sub(r"^void\s+", "", r[name_at]).split("(")[0].strip()[:60]
        launches[name] += 1
        grid_at = col.get("Grid Size")
        us = number(r[col["gpu__time_duration.sum"]]) if "gpu__time_duration.sum" in col else None
        shapes[name].append((us / 1e3 if us is not None else None,
                             r[grid_at].replace(" ", "") if grid_at is not None else "?"))
        for metric, i in col.items():
            v = number(r[i])
            if v is not None:
                sums[name][metric].append(v)


def main(paths):
    sums = defaultdict(lambda: defaultdict(list))
    launches = defaultdict(int)
    shapes = defaultdict(list)
    for p in paths:
        read(p, sums, launches, shapes)
    if not sums:
        sys.exit("no launches in " + ", ".join(paths))
    mean = lambda vals: sum(vals) / len(vals)
    print("Nsight Compute full set, first launches of each family in a steady frame "
          "(profiler clocks, caches flushed)")
    for name in sorted(sums, key=lambda n: -mean(sums[n].get("gpu__time_duration.sum", [0]))):
        m = sums[name]
        print()
        each = ", ".join(f"{us:.1f} us grid {grid}" if us is not None else f"grid {grid}"
                         for us, grid in shapes[name])
        print(f"{name} ({launches[name]} launches: {each})")
        cells = []
        for title, metric in SUMMARY:
            if metric in m:
                v = mean(m[metric])
                if metric == "gpu__time_duration.sum":
                    v /= 1e3  # ns
                cells.append(f"{title} {v:.1f}")
        print("  " + "; ".join(cells))
        stalls = []
        for metric, vals in m.items():
            hit = STALL.match(metric) or STALL_ALT.match(metric)
            if hit and not hit.group(1).endswith("_not_issued"):
                stalls.append((mean(vals), hit.group(1)))
        stalls.sort(reverse=True)
        total = sum(v for v, _ in stalls) or 1.0
        print("  stalls (cycles per issued instruction): " + ", ".join(
            f"{reason} {v:.2f} ({100 * v / total:.0f} %)" for v, reason in stalls[:8] if v > 0))


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: ncu_stalls.py NCU_RAW_CSV [NCU_RAW_CSV ...]")
    main(sys.argv[1:])
