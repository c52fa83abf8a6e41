//! The GPU machine's helper scripts (`scripts/gpu/*.py`) read what `bench` writes and what Nsight
//! Compute prints; they run only there, so CI runs them here on small inputs of the same form, so
//! they cannot rot between GPU sessions. Skips (with the reason) where there is no python3.

use std::path::{Path, PathBuf};
use std::process::Command;

fn script(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("scripts/gpu")
        .join(name)
}

/// The script's stdout, or None (with the reason printed) when python3 is missing.
fn run_python(script_name: &str, args: &[&Path]) -> Option<String> {
    let out = match Command::new("python3")
        .arg(script(script_name))
        .args(args)
        .output()
    {
        Ok(out) => out,
        Err(e) => {
            eprintln!("skipped: python3 cannot run here: {e}");
            return None;
        }
    };
    assert!(
        out.status.success(),
        "{script_name} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Some(String::from_utf8(out.stdout).unwrap())
}

fn e2e_json(period: f64, aggregator: f64) -> String {
    format!(
        r#"{{"median_period_ms": {period}, "median_parts": {{"dino_ms": 2.1,
        "aggregator_ms": {aggregator}, "heads_ms": 2.4, "between_aggregators_ms": 3.6}},
        "growth": []}}"#
    )
}

#[test]
fn summary_tabulates_each_build_against_the_reference() {
    let dir = tempfile::tempdir().unwrap();
    let logs = dir.path();
    for (build, base) in [("streamrecon", 19.0), ("baseline", 20.0)] {
        for round in 1..=2 {
            let period = base + round as f64 / 10.0;
            let path = logs.join(format!("e2e-one-{build}-{round}.json"));
            std::fs::write(path, e2e_json(period, 15.5)).unwrap();
        }
    }
    std::fs::write(
        logs.join("anchor-e2e.jsonl"),
        "{\"config\": \"fi_compile\", \"median_ms\": 48.4, \"p10_ms\": 48.0, \"p90_ms\": 50.0}\n",
    )
    .unwrap();
    std::fs::write(
        logs.join("anchor-attention.jsonl"),
        "{\"live\": 72, \"total_frames\": 72, \"lkv\": 72360, \"sdpa_dense_ms\": 0.722, \
         \"sdpa_dense_tflops\": 413.0, \"fi_ms\": 1.28, \"fi_tflops\": 233.0}\n\
         {\"ceiling_bf16_matmul_tflops\": 776.0}\n",
    )
    .unwrap();
    let Some(out) = run_python("summary.py", &[logs]) else {
        return;
    };
    // Each build's rounds in order, the median of the parts, the ratio to the reference's median
    // (48.4 / 19.15 and 48.4 / 20.15).
    assert!(
        out.contains("| one | streamrecon | 19.10, 19.20 | 15.50 | 3.60 | 2.40 | 2.10 | 2.53x |"),
        "{out}"
    );
    assert!(
        out.contains("| one | baseline | 20.10, 20.20 | 15.50 | 3.60 | 2.40 | 2.10 | 2.40x |"),
        "{out}"
    );
    assert!(out.contains("median 48.40 ms"), "{out}");
    assert!(
        out.contains("| 72/72 | 0.722 (413) | 1.280 (233) |"),
        "{out}"
    );
    assert!(out.contains("bf16 matmul tflops 776.0"), "{out}");
}

/// One row of `ncu --csv --metrics gpu__time_duration.sum --print-units base`.
fn ncu_row(id: u32, kernel: &str, stream: u32, ns: &str) -> String {
    format!(
        "\"{id}\",\"4242\",\"streamrecon\",\"127.0.0.1\",\"{kernel}\",\"1\",\"{stream}\",\
         \"(384, 1, 1)\",\"(128, 1, 1)\",\"0\",\"9.0\",\"Command line profiler metrics\",\
         \"gpu__time_duration.sum\",\"nsecond\",\"{ns}\"\n"
    )
}

#[test]
fn ncu_families_splits_a_frame_by_family_and_part() {
    let mut csv = String::from("==PROF== Connected to process 4242\n");
    csv.push_str(
        "\"ID\",\"Process ID\",\"Process Name\",\"Host Name\",\"Kernel Name\",\"Context\",\
         \"Stream\",\"Block Size\",\"Grid Size\",\"Device\",\"CC\",\"Section Name\",\
         \"Metric Name\",\"Metric Unit\",\"Metric Value\"\n",
    );
    let rows = [
        (0, "patchify_normalized", 14, "5,000"),
        (1, "nvjet_hsh_256x128_64x4_1x2_h_bz_coopA_NTN", 14, "17,000"),
        (2, "paged_attention_fwd_sm90_ws_qkv", 14, "22,000"),
        (3, "qkv_split_norm_rope", 7, "10,000"),
        (4, "paged_attention_fwd_sm90_ws_m256_log2", 7, "500,000"),
        (
            5,
            "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64",
            7,
            "20,000",
        ),
        (6, "residual_layer_norm_1024", 7, "6,000"),
        // The main stream goes on with the camera head; the depth head has a stream of its own.
        (7, "cam_sweep_k8192", 7, "20,000"),
        (8, "dpt_im2col3x3", 9, "35,000"),
        (
            9,
            "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize256x128x64",
            9,
            "40,000",
        ),
        (10, "an_unknown_kernel", 7, "1,000"),
        (11, "dpt_points_write", 7, "8,000"),
    ];
    for (id, kernel, stream, ns) in rows {
        csv.push_str(&ncu_row(id, kernel, stream, ns));
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ncu.csv");
    std::fs::write(&path, &csv).unwrap();
    let Some(out) = run_python("ncu_families.py", &[&path]) else {
        return;
    };
    assert!(out.contains("12 kernels, 0.68 ms"), "{out}");
    // GEMMs: 17 on the front, 20 in the aggregator, 40 in the depth head.
    assert!(out.contains("| GEMM (cuBLASLt) | 3 | 0.077 |"), "{out}");
    assert!(out.contains("| global attention | 1 | 0.500 |"), "{out}");
    assert!(
        out.contains("| frame-local attention | 1 | 0.022 |"),
        "{out}"
    );
    // The main stream is the aggregator until the camera head's first kernel.
    assert!(out.contains("| main: aggregator | 4 | 0.536 |"), "{out}");
    assert!(out.contains("| main: camera head | 1 | 0.020 |"), "{out}");
    assert!(
        out.contains("| main: after the camera head (points) | 2 | 0.009 |"),
        "{out}"
    );
    assert!(out.contains("| depth head stream | 2 | 0.075 |"), "{out}");
    assert!(out.contains("| front: images, DINO | 3 | 0.044 |"), "{out}");
    assert!(out.contains("an_unknown_kernel 1.0 us"), "{out}");

    // Against a baseline whose LayerNorm took 8 us: the family and the kernel show the change.
    let base_path = dir.path().join("baseline.csv");
    std::fs::write(
        &base_path,
        csv.replace(
            &ncu_row(6, "residual_layer_norm_1024", 7, "6,000"),
            &ncu_row(6, "residual_layer_norm_1024", 7, "8,000"),
        ),
    )
    .unwrap();
    let out = run_python("ncu_families.py", &[&path, &base_path]).unwrap();
    assert!(
        out.contains("| LayerNorm, residual | 0.006 | 0.008 | -2.0 |"),
        "{out}"
    );
    assert!(
        out.contains("| residual_layer_norm_1024 | 1 | 6.0 | 1 | 8.0 | -2.0 |"),
        "{out}"
    );
}

/// One row of `ncu --section ... --csv --page details --print-units base`.
fn ncu_detail_row(
    id: u32,
    kernel: &str,
    section: &str,
    metric: &str,
    unit: &str,
    value: &str,
) -> String {
    format!(
        "\"{id}\",\"4242\",\"streamrecon\",\"127.0.0.1\",\"{kernel}\",\"1\",\"7\",\
         \"(256, 1, 1)\",\"(251, 1, 1)\",\"0\",\"9.0\",\"{section}\",\"{metric}\",\"{unit}\",\"{value}\"\n"
    )
}

#[test]
fn ncu_detail_averages_each_kernels_launches() {
    let mut csv = String::from(
        "\"ID\",\"Process ID\",\"Process Name\",\"Host Name\",\"Kernel Name\",\"Context\",\
         \"Stream\",\"Block Size\",\"Grid Size\",\"Device\",\"CC\",\"Section Name\",\
         \"Metric Name\",\"Metric Unit\",\"Metric Value\"\n",
    );
    for (id, ns, occ) in [(0, "6,000", "40.5"), (1, "7,000", "41.5")] {
        let k = "residual_layer_norm_1024(float *, const unsigned short *)";
        csv.push_str(&ncu_detail_row(
            id,
            k,
            "GPU Speed Of Light Throughput",
            "Duration",
            "nsecond",
            ns,
        ));
        csv.push_str(&ncu_detail_row(
            id,
            k,
            "Occupancy",
            "Achieved Occupancy",
            "%",
            occ,
        ));
        csv.push_str(&ncu_detail_row(
            id,
            k,
            "Launch Statistics",
            "Grid Size",
            "",
            "251",
        ));
    }
    csv.push_str(&ncu_detail_row(
        2,
        "qkv_split_norm_rope",
        "GPU Speed Of Light Throughput",
        "Duration",
        "nsecond",
        "9,000",
    ));
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("detail.csv");
    std::fs::write(&path, csv).unwrap();
    let Some(out) = run_python("ncu_detail.py", &[&path]) else {
        return;
    };
    assert!(out.contains("3 launches"), "{out}");
    // Means over the two launches; the longest kernel in total first.
    assert!(
        out.contains("| residual_layer_norm_1024 | 2 | 6.5 | 251.0 | - | - | - | - | 41.0 |"),
        "{out}"
    );
    assert!(
        out.contains("| qkv_split_norm_rope | 1 | 9.0 | - |"),
        "{out}"
    );
    let first = out.find("residual_layer_norm_1024").unwrap();
    assert!(first < out.find("qkv_split_norm_rope").unwrap(), "{out}");
}
