//! `vramtrace replay` on a real H200 trace: PyTorch with caching off, six tensors, a 53 MiB peak.

mod common;

use common::*;

const TRACE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/samples/h200/torch-nocache");

fn replay(args: &[&str]) -> std::process::Output {
    std::process::Command::new(vramtrace())
        .arg("replay")
        .arg(TRACE)
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn a_card_it_fits_exits_0_with_the_lowest_headroom() {
    let o = replay(&[
        "--capacity",
        "64MiB",
        "--resident",
        "8MiB",
        "--granularity",
        "0",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", describe(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("traced peak 53.00 MiB"), "{out}");
    assert!(
        out.contains("fits: the lowest headroom is 3.00 MiB"),
        "{out}"
    );
}

#[test]
fn a_card_too_small_exits_1_naming_the_allocation_that_would_fail() {
    let o = replay(&["--capacity", "52MiB", "--json", "--granularity", "0"]);
    assert_eq!(o.status.code(), Some(1), "{}", describe(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let f = &v["devices"][0]["first_failure"];
    assert_eq!(f["api"], "cuMemAlloc_v2");
    assert_eq!(f["size"], 50u64 << 20);
    // The six tensors plus a 4 KiB allocation live from the start.
    assert_eq!(v["devices"][0]["peak_bytes"], (53u64 << 20) + 4096);
    assert_eq!(v["devices"][0]["would_fail"], 1);
}

#[test]
fn a_resident_as_large_as_the_card_is_refused() {
    let o = replay(&["--capacity", "1GiB", "--resident", "1GiB"]);
    assert_eq!(o.status.code(), Some(2), "{}", describe(&o));
    assert!(String::from_utf8_lossy(&o.stderr).contains("leaves nothing"));
}

/// The same Qwen3.6-27B prefill on real kernels, recorded on the H200 once without a limit
/// (samples/h200/prefill-uncapped) and once limited to 18 GiB by a ballast
/// (samples/h200/prefill-18gib, out of memory on `h` in chunk 2 with 73.12 MiB free). Replayed
/// against 18 GiB at the driver's 2 MiB pages, the uncapped trace names the same request.
#[test]
fn an_uncapped_trace_replayed_on_18_gib_fails_where_the_capped_run_did() {
    let trace = concat!(env!("CARGO_MANIFEST_DIR"), "/samples/h200/prefill-uncapped");
    let o = std::process::Command::new(vramtrace())
        .args([
            "replay",
            trace,
            "--capacity",
            "18GiB",
            "--json",
            "--frames",
            "0",
        ])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", describe(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let f = &v["devices"][0]["first_failure"];
    assert_eq!(f["size"], 102_236_160u64, "h");
    assert_eq!(
        f["label"],
        "prefill/chunk.2/layer.0/gdn/chunk_gated_delta_rule/chunk_gated_delta_rule_fwd_h"
    );
    // The capped run's driver said 73.12 MiB free when it refused h.
    let free = f["free_before"].as_u64().unwrap();
    assert!((70 << 20..80 << 20).contains(&free), "{free}");
}
