#!/usr/bin/env python3
"""Where a profiled frame's GPU time goes, by kernel family and part of the frame.

    python3 scripts/gpu/ncu_families.py NCU_CSV [BASELINE_NCU_CSV]

NCU_CSV is what `ncu --csv --metrics gpu__time_duration.sum` wrote for one frame
(scripts/gpu/run.sh profile: `bench e2e --profiler-frame N` brackets the frame). Lines that are
not CSV rows of that report (the program's own output, ==PROF== notes) are skipped. With a
second report (the same frame of a baseline build), the families side by side and the kernels
whose time changed most follow.

A kernel's part of the frame comes from its stream: the stream that runs `patchify_normalized`
is the front (the next images and DINO), the one that runs the depth head's `dpt_im2col3x3` or
`dpt_layernorm_rows` the depth head; the main stream runs the aggregator, then the camera head
(`cam_` kernels) and the points. ncu serialises kernels and flushes caches before each, at its
own clocks: the totals are larger than a frame in the graph, and the shares are what to read.
"""

import csv
import re
import sys
from collections import defaultdict

# (family, pattern on the kernel name), first match wins: ours before cuBLASLt's, whose names
# (sm90_xmma_…, nvjet_…, cutlass…) could otherwise take ours (paged_attention_fwd_sm90_…).
FAMILIES = [
    ("global attention", r"^paged_attention_fwd_sm90_ws_(m256|n192)"),
    ("frame-local attention", r"^paged_attention_fwd(_sm90_ws(_qkv)?)?$"),
    ("attention merge", r"^attention_combine"),
    ("q/k/v split, qk-norm, RoPE", r"^qkv_split"),
    ("LayerNorm, residual", r"^(residual_|layer_norm)"),
    ("bias, GELU", r"^(add_bias|gelu)"),
    ("KV cache", r"^kv_"),
    ("camera head", r"^cam_"),
    ("depth head: im2col", r"^dpt_im2col"),
    ("depth head: fused output conv", r"^dpt_output_conv"),
    ("points", r"^dpt_(points|decode_pose)"),
    ("depth head: other", r"^dpt_"),
    ("images, patch embedding", r"^(preprocess_|image_to_rgb8|patchify|dino_)"),
    ("copies, conversions", r"^(copy_|f32_to_bf16)"),
    ("GEMM (cuBLASLt)", r"(gemm|nvjet|cutlass|xmma|cublas)"),
]


def family_of(name):
    short = re.sub(r"^void\s+", "", name).split("(")[0].split("<")[0].strip()
    for family, pattern in FAMILIES:
        if re.search(pattern, short):
            return family
    return "other"


def to_us(value, unit):
    v = float(value.replace(",", ""))
    scale = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3,
             "msecond": 1e3, "s": 1e6, "second": 1e6}
    if unit not in scale:
        raise ValueError(f"unknown time unit {unit!r}")
    return v * scale[unit]


def read_kernels(path):
    """[(id, name, stream, microseconds)] in profiling order."""
    with open(path, newline="") as f:
        lines = [l for l in f if l.startswith('"')]
    rows = list(csv.reader(lines))
    header_at = next((i for i, r in enumerate(rows) if "Kernel Name" in r and "Metric Value" in r),
                     None)
    if header_at is None:
        sys.exit(f"{path}: no ncu CSV header (a row with \"Kernel Name\" and \"Metric Value\")")
    header = rows[header_at]
    col = {name: header.index(name) for name in header}
    kernels = []
    for r in rows[header_at + 1:]:
        if len(r) != len(header) or r[col["Metric Name"]] != "gpu__time_duration.sum":
            continue
        stream = r[col["Stream"]] if "Stream" in col else ""
        kernels.append((int(r[col["ID"]]), r[col["Kernel Name"]], stream,
                        to_us(r[col["Metric Value"]], r[col["Metric Unit"]])))
    kernels.sort(key=lambda k: k[0])
    return kernels


def parts_of(kernels):
    """The part of the frame each kernel belongs to, from its stream (see the module's text)."""
    front = {s for _, n, s, _ in kernels if n.startswith("patchify_normalized")}
    depth = {s for _, n, s, _ in kernels
             if n.startswith(("dpt_im2col3x3", "dpt_layernorm_rows"))} - front
    parts, heads_started = [], False
    for _, name, stream, _ in kernels:
        if stream in front:
            parts.append("front: images, DINO")
        elif stream in depth:
            parts.append("depth head stream")
        elif name.startswith("cam_"):
            heads_started = True
            parts.append("main: camera head")
        else:
            heads_started = heads_started or name.startswith("dpt_")
            parts.append("main: after the camera head (points)" if heads_started
                         else "main: aggregator")
    return parts


def short_name(name):
    return re.sub(r"^void\s+", "", name).split("(")[0].strip()[:70]


def compare(kernels, base):
    """Families side by side, then the kernels (by name) whose frame total moved most."""
    def totals(ks, key):
        out = defaultdict(lambda: [0, 0.0])
        for _, name, _, us in ks:
            k = key(name)
            out[k][0] += 1
            out[k][1] += us
        return out
    new_f, old_f = totals(kernels, family_of), totals(base, family_of)
    print()
    print(f"Against the baseline's frame: {sum(k[3] for k in kernels) / 1e3:.3f} ms "
          f"({len(kernels)} kernels) against {sum(k[3] for k in base) / 1e3:.3f} ms "
          f"({len(base)} kernels)")
    print()
    print("| family | ms | baseline ms | change (us) |")
    print("|---|---|---|---|")
    for fam in sorted(set(new_f) | set(old_f), key=lambda f: -old_f[f][1]):
        a, b = new_f[fam][1], old_f[fam][1]
        print(f"| {fam} | {a / 1e3:.3f} | {b / 1e3:.3f} | {a - b:+.1f} |")
    new_k, old_k = totals(kernels, short_name), totals(base, short_name)
    moved = sorted(set(new_k) | set(old_k), key=lambda k: -abs(new_k[k][1] - old_k[k][1]))
    print()
    print("| kernel | launches | mean us | baseline launches | baseline mean us | change a frame (us) |")
    print("|---|---|---|---|---|---|")
    for k in moved[:15]:
        (n, a), (m, b) = new_k[k], old_k[k]
        mean_a = f"{a / n:.1f}" if n else "-"
        mean_b = f"{b / m:.1f}" if m else "-"
        print(f"| {k} | {n} | {mean_a} | {m} | {mean_b} | {a - b:+.1f} |")


def main(path, baseline=None):
    kernels = read_kernels(path)
    if not kernels:
        sys.exit(f"{path}: no gpu__time_duration.sum rows")
    parts = parts_of(kernels)
    total = sum(k[3] for k in kernels)
    by_family = defaultdict(lambda: [0, 0.0])
    by_part = defaultdict(lambda: [0, 0.0])
    by_both = defaultdict(float)
    others = defaultdict(float)
    for (_, name, _, us), part in zip(kernels, parts):
        fam = family_of(name)
        by_family[fam][0] += 1
        by_family[fam][1] += us
        by_part[part][0] += 1
        by_part[part][1] += us
        by_both[(part, fam)] += us
        if fam == "other":
            others[name[:80]] += us
    print(f"Nsight Compute, one frame: {len(kernels)} kernels, {total / 1e3:.2f} ms "
          "(serialised, caches flushed, profiler clocks)")
    print()
    print("| family | kernels | ms | share |")
    print("|---|---|---|---|")
    for fam, (n, us) in sorted(by_family.items(), key=lambda kv: -kv[1][1]):
        print(f"| {fam} | {n} | {us / 1e3:.3f} | {100 * us / total:.1f} % |")
    print()
    print("| part of the frame | kernels | ms | largest families (ms) |")
    print("|---|---|---|---|")
    for part, (n, us) in sorted(by_part.items(), key=lambda kv: -kv[1][1]):
        fams = sorted(((f, t) for (p, f), t in by_both.items() if p == part), key=lambda x: -x[1])
        top = ", ".join(f"{f} {t / 1e3:.2f}" for f, t in fams[:4])
        print(f"| {part} | {n} | {us / 1e3:.3f} | {top} |")
    if others:
        print()
        print("Kernels of no family: " + "; ".join(
            f"{n} {us:.1f} us" for n, us in sorted(others.items(), key=lambda kv: -kv[1])[:10]))
    if baseline:
        base = read_kernels(baseline)
        if not base:
            sys.exit(f"{baseline}: no gpu__time_duration.sum rows")
        compare(kernels, base)


if __name__ == "__main__":
    if len(sys.argv) not in (2, 3):
        sys.exit("usage: ncu_families.py NCU_CSV [BASELINE_NCU_CSV]")
    main(*sys.argv[1:])
