//! The built binary end to end: `--simulate` on the stand-in driver
//! (testbed/fakecuda's libcuda.so, built for these tests), out-of-memory, and the errors a user meets first.

mod common;

use std::path::Path;
use std::process::Output;

use common::{describe, libs, run, skipped};
use serde_json::Value;

fn json(out: &Output) -> Value {
    assert!(out.status.success(), "{}", describe(out));
    serde_json::from_slice(&out.stdout).expect("--json prints JSON")
}

const GDN_4128: [&str; 10] = [
    "gdn",
    "--tokens",
    "4128",
    "--heads",
    "48",
    "--key-dim",
    "128",
    "--value-dim",
    "128",
    "--simulate",
];

#[test]
fn simulated_gdn_makes_fla_060s_allocations() {
    let dir = libs();
    let mut args = GDN_4128.to_vec();
    args.push("--json");
    let j = json(&run(dir, None, &args));
    assert_eq!(j["simulated"], true);
    let tensors = j["tensors"].as_array().unwrap();
    let got: Vec<(String, u64, u64)> = tensors
        .iter()
        .map(|t| {
            (
                t["name"].as_str().unwrap().to_string(),
                t["bytes"].as_u64().unwrap(),
                t["free_seq"].as_u64().unwrap(),
            )
        })
        .collect();
    // (name, bytes, position of its free among the 26 driver calls)
    let want: Vec<(&str, u64, u64)> = vec![
        ("q", 50_724_864, 26),
        ("k", 50_724_864, 25),
        ("v", 50_724_864, 24),
        ("g", 792_576, 23),
        ("beta", 396_288, 22),
        ("g_cumsum", 792_576, 19),
        ("A", 25_362_432, 18),
        ("w", 50_724_864, 14),
        ("u", 50_724_864, 15),
        ("h", 102_236_160, 16),
        ("final_state", 3_145_728, 21),
        ("v_new", 50_724_864, 17),
        ("o", 50_724_864, 20),
    ];
    let want: Vec<(String, u64, u64)> = want
        .into_iter()
        .map(|(n, b, f)| (n.to_string(), b, f))
        .collect();
    assert_eq!(got, want);
    assert_eq!(j["peak_bytes_above_inputs"], 334_436_352);
    assert_eq!(
        j["tensors"][9]["shape"],
        serde_json::json!([1, 65, 48, 128, 128])
    );
    assert_eq!(
        j["tensors"][6]["stage"],
        "chunk_gated_delta_rule/chunk_gated_delta_rule_fwd_intra/kkt_solve"
    );
}

#[test]
fn simulated_fa_lse_layouts_and_max_seqlen_k() {
    let dir = libs();
    let base = [
        "fa",
        "--seqlens",
        "4000,128",
        "--heads",
        "24",
        "--kv-heads",
        "4",
        "--head-dim",
        "256",
        "--simulate",
        "--json",
    ];
    let sizes = |j: &Value| -> Vec<(String, u64)> {
        j["tensors"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| {
                (
                    t["name"].as_str().unwrap().into(),
                    t["bytes"].as_u64().unwrap(),
                )
            })
            .collect()
    };
    let plain = json(&run(dir, None, &base));
    let names: Vec<String> = sizes(&plain).into_iter().map(|s| s.0).collect();
    assert_eq!(
        names,
        [
            "q",
            "k",
            "v",
            "cu_seqlens_q",
            "cu_seqlens_k",
            "out",
            "softmax_lse",
            "rng_state",
            "_unused_philox_offset"
        ]
    );
    assert_eq!(plain["tensors"][6]["shape"], serde_json::json!([24, 4128]));
    assert_eq!(plain["tensors"][6]["bytes"], 396_288);

    let mut long_k = base.to_vec();
    long_k.extend(["--max-seqlen-k", "262144"]);
    assert_eq!(sizes(&json(&run(dir, None, &long_k))), sizes(&plain));

    let mut padded = base.to_vec();
    padded.extend([
        "--padded-lse",
        "--max-seqlen-q",
        "262144",
        "--api",
        "flash-attn",
    ]);
    let p = json(&run(dir, None, &padded));
    assert_eq!(p["tensors"][6]["shape"], serde_json::json!([2, 24, 262144]));
    assert_eq!(p["tensors"][6]["bytes"], 2 * 24 * 262_144 * 4);
    assert_eq!(p["tensors"].as_array().unwrap().len(), 8);
}

#[test]
fn a_small_card_fails_on_a_named_tensor() {
    let dir = libs();
    let out = run(dir, Some("400000000"), &GDN_4128);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("allocating v_new (bf16 [1, 4128, 48, 128], 50724864 bytes) failed"),
        "{stderr}"
    );
    assert!(stderr.contains("CUDA_ERROR_OUT_OF_MEMORY"), "{stderr}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("final_state"),
        "the table up to the failure: {stdout}"
    );
}

#[test]
fn real_kernels_on_the_stand_in_are_refused_clearly() {
    let dir = libs();
    let out = run(dir, None, &GDN_4128[..9]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("stand-in") && stderr.contains("--simulate"),
        "{stderr}"
    );
}

#[test]
fn no_driver_is_a_clear_error() {
    let out = run(Path::new("/nonexistent"), None, &GDN_4128);
    let stderr = String::from_utf8_lossy(&out.stderr);
    if out.status.success() {
        skipped(
            "VRAMTRACE_REQUIRE_NO_DRIVER",
            "no_driver_is_a_clear_error: a CUDA driver is installed system-wide",
        );
        return;
    }
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr.contains("no CUDA driver library"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[test]
fn bad_shapes_are_sentences() {
    let out = run(
        Path::new("/nonexistent"),
        None,
        &[
            "gdn",
            "--tokens",
            "10",
            "--heads",
            "3",
            "--key-heads",
            "2",
            "--key-dim",
            "8",
            "--value-dim",
            "8",
            "--simulate",
        ],
    );
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("is not a multiple of --key-heads 2"),
        "{stderr}"
    );
}
