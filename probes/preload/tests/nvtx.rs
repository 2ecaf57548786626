//! NVTX ranges through NVIDIA's own NVTX v3 loader (the `nvtx` crate, in the standalone
//! `tests/nvtx_client` package) label the allocations made inside them.

mod common;

use std::path::Path;
use std::process::Command;

use common::*;
use vramtrace_format::{EventKind, Record};

/// Builds `tests/nvtx_client` into its own target directory and returns the binary; `None` (the
/// test then says it skipped) when libclang, which bindgen needs, is missing and
/// `VRAMTRACE_REQUIRE_NVTX` is not set (CI sets it after installing libclang-dev).
fn nvtx_client() -> Option<std::path::PathBuf> {
    let target = profile_dir()
        .join("preload-tests")
        .join("nvtx-client-target");
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/nvtx_client/Cargo.toml");
    let o = Command::new(env!("CARGO"))
        .arg("build")
        .arg("--manifest-path")
        .arg(&manifest)
        .env("CARGO_TARGET_DIR", &target)
        .output()
        .expect("running cargo");
    let stderr = String::from_utf8_lossy(&o.stderr);
    if !o.status.success() && stderr.contains("libclang") {
        vramtrace_testkit::skip(
            "VRAMTRACE_REQUIRE_NVTX",
            "nvtx_ranges_label_allocations: libclang is not installed (bindgen needs it for the \
             nvtx crate; `apt-get install libclang-dev`)",
        );
        return None;
    }
    assert!(
        o.status.success(),
        "building the NVTX client failed (nvtx-sys runs bindgen, which needs libclang: \
         `apt-get install libclang-dev`):\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    Some(target.join("debug").join("vramtrace-nvtx-client"))
}

#[test]
fn nvtx_ranges_label_allocations() {
    let s = Scratch::new("nvtx");
    let Some(exe) = nvtx_client() else { return };
    let mut cmd = traced(&exe, &s.trace_dir());
    cmd.env("NVTX_INJECTION64_PATH", preload());
    let out = run_ok(cmd);
    let t = only_trace(&s.trace_dir());
    let label = |name: &str| {
        let ptr = num(lines(&out, name)[0][0]);
        let e = events(&t)
            .into_iter()
            .find(|e| e.kind == EventKind::Alloc && e.ptr == ptr)
            .unwrap();
        assert_eq!(
            e.size,
            [1000, 2000, 3000, 4000, 5000][(name.as_bytes()[0] - b'A') as usize]
        );
        string(&t, e.label)
    };
    // nvtxRangePushA, nvtxRangePushEx (ASCII), nvtxRangePushW, nvtxDomainRangePushEx.
    assert_eq!(label("A").as_deref(), Some("step"));
    assert_eq!(label("B").as_deref(), Some("step/attention"));
    assert_eq!(label("C").as_deref(), Some("step/attention/wide\u{e9}"));
    assert_eq!(label("D").as_deref(), Some("step/dom"));
    assert_eq!(label("E"), None, "every range popped");
    let marks: Vec<String> = t
        .records
        .iter()
        .filter_map(|r| match r {
            Record::Mark { name, .. } => string(&t, *name),
            _ => None,
        })
        .collect();
    assert_eq!(marks, vec!["start", "in-domain"]);
    let count = |f: fn(&Record) -> bool| t.records.iter().filter(|r| f(r)).count();
    assert_eq!(count(|r| matches!(r, Record::RangePush { .. })), 4);
    assert_eq!(count(|r| matches!(r, Record::RangePop { .. })), 4);
}
