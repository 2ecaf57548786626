//! Issue 19 item 4 on a real H200 run (`samples/h200/ring-decode-2mib`, docs/validation.md):
//! transformers' hybrid Qwen3.5 (8 layers, fla) decoding under `vramtrace run --max-size
//! 2MiB`, killed by its call's timeout in the middle of the decode. The file stays within its
//! budget, every reader says which time range lost tensor detail, and the live set survives
//! the drops (the weights, restated when the blocks stating them were reused).

mod common;

use common::*;
use std::path::PathBuf;
use std::process::Command;

fn sample() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("samples/h200/ring-decode-2mib")
}

fn summary(json: bool) -> String {
    let mut cmd = Command::new(vramtrace());
    cmd.arg("summary");
    if json {
        cmd.arg("--json");
    }
    let o = cmd.arg(sample()).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8(o.stdout).unwrap()
}

#[test]
fn a_two_mib_budget_on_a_real_decode_keeps_its_size_says_what_it_lost_and_keeps_the_live_set() {
    let file = sample().join("486.vtr");
    let len = std::fs::metadata(&file).unwrap().len();
    // The budget, plus the file's header page.
    assert_eq!(len, 2 * 1024 * 1024 + 4096);

    let j: serde_json::Value = serde_json::from_str(&summary(true)).unwrap();
    let p = &j["processes"][0];
    assert_eq!(p["tensor_capture"]["events"], 63_574);
    let lost = p["tensor_detail_lost"].as_array().unwrap();
    assert_eq!(lost.len(), 1, "{lost:?}");
    assert_eq!(lost[0]["blocks"], 54);
    assert!((lost[0]["from_s"].as_f64().unwrap() - 0.0515).abs() < 1e-3);
    assert!((lost[0]["to_s"].as_f64().unwrap() - 75.413).abs() < 1e-3);
    let dev = p["devices"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["device"] == 0)
        .unwrap();
    let t = &dev["tensors"];
    // Every allocation read is after the drops; the weights, allocated inside the dropped
    // range, are live all the same: restated when the blocks holding them were reused.
    assert_eq!(
        (t["allocations"].as_u64(), t["frees"].as_u64()),
        (Some(31_697), Some(31_692))
    );
    assert_eq!(t["live_at_end"], 1_437_909_504u64);
    // At the peak, the largest tensors are the weights, each marked as known from a restatement.
    let largest = t["at_peak"]["tensors"].as_array().unwrap();
    assert!(
        largest.iter().take(4).all(|x| x["restated"] == true),
        "{largest:?}"
    );

    let text = summary(false);
    assert!(
        text.contains(
            "tensor detail lost to the size budget from 51.5 ms to 75.413 s (54 blocks dropped; driver events, failures and the live set kept)"
        ),
        "{text}"
    );
    assert!(text.contains("@ linear.py:109 __init__"), "{text}");
    // The weights were restated at 71.004 s; they were allocated before, in the dropped range.
    assert!(
        text.contains(
            "128.00 MiB  tensor 0x7f57c8000000 in segment 0x7f57c8000000 t≤71.004 s (restated: its allocation record was dropped) @ linear.py:109 __init__"
        ),
        "{text}"
    );
    assert!(!text.contains("t=71.004 s"), "{text}");

    // The events of the ring's restatements, as `events` lists them.
    let o = Command::new(vramtrace())
        .arg("events")
        .arg(sample())
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", describe(&o));
    let events = String::from_utf8_lossy(&o.stdout);
    let live = events
        .lines()
        .filter(|l| l.contains("\"kind\":\"tensor_live\""))
        .count();
    assert_eq!(live, 165);
}
