//! End-to-end through cudarc's own loader: the reference workload (cudarc, dynamic loading) in
//! `--simulate` mode on the stand-in driver, recorded by `vramtrace run`, equals the analytical
//! models byte for byte.

mod common;

use common::*;
use std::process::Command;

const CONFIG: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/samples/models/Qwen3.6-27B/config.json"
);

fn workload() -> std::path::PathBuf {
    target_dir().join("vramtrace-workload")
}

fn compare_json(trace: &std::path::Path, args: &[&str]) -> serde_json::Value {
    let o = Command::new(vramtrace())
        .arg("compare")
        .arg(trace)
        .args(["--model", CONFIG, "--json"])
        .args(args)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", describe(&o));
    serde_json::from_slice(&o.stdout).unwrap()
}

fn assert_exact(v: &serde_json::Value) {
    let a = &v["attribution"];
    for r in a["rows"].as_array().unwrap() {
        assert_eq!(r["difference"], 0, "{r}");
        assert_eq!(
            r["matched_by"], "label",
            "every tensor is named by the workload: {r}"
        );
    }
    assert_eq!(a["unexplained_bytes"], 0);
    assert_eq!(v["named_fraction"], 1.0);
}

/// Records `vramtrace-workload ARGS --simulate` on the stand-in driver, then compares it with
/// the model chosen by `model_args`.
fn trace_and_compare(name: &str, workload_args: &str, model_args: &str) -> serde_json::Value {
    let out = scratch(name).join("trace");
    let wl = workload();
    let mut prog = vec![wl.as_os_str()];
    prog.extend(workload_args.split_whitespace().map(std::ffi::OsStr::new));
    prog.push(std::ffi::OsStr::new("--simulate"));
    let o = run_traced(&out, "24GiB", &prog);
    assert_eq!(o.status.code(), Some(0), "{}", describe(&o));
    compare_json(&out, &model_args.split_whitespace().collect::<Vec<_>>())
}

#[test]
fn gdn_simulate_equals_the_fla_model() {
    let v = trace_and_compare(
        "wl-gdn",
        "gdn --tokens 4128 --heads 48 --key-heads 16 --key-dim 128 --value-dim 128",
        "--variant fla-0.6.0 --tokens 4128",
    );
    assert_exact(&v);
    assert_eq!(v["attribution"]["attributed_bytes"], 334_436_352u64);
}

#[test]
fn gdn_varlen_simulate_equals_the_fla_model() {
    let v = trace_and_compare(
        "wl-gdn-varlen",
        "gdn --seqlens 1000,3000,128 --heads 16 --key-heads 8 --key-dim 64 --value-dim 128",
        "--variant fla-0.6.0 --seqlens 1000,3000,128 --value-heads 16 --key-heads 8 --key-dim 64 --value-dim 128",
    );
    assert_exact(&v);
}

#[test]
fn fa_simulate_equals_the_pytorch_model_whatever_max_seqlen_k() {
    let v = trace_and_compare(
        "wl-fa",
        "fa --seqlens 4128 --heads 24 --kv-heads 4 --head-dim 256 --max-seqlen-k 262144",
        "--variant pytorch --tokens 4128 --max-seqlen-k 262144",
    );
    assert_exact(&v);
}
