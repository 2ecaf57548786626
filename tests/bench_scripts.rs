//! The benchmark scripts' arithmetic, on kept H200 data: `scripts/validate/serve_pool.py` pools
//! serve_bench.sh calls (samples/h200/serve-turns) into the tables docs/performance.md quotes,
//! pools several toggled servers' turns together, leaves failed batches out and says so, and
//! refuses a malformed file.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use vramtrace_testkit::{describe, scratch};

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn serve_pool(args: &[&Path]) -> Output {
    Command::new("python3")
        .arg(root().join("scripts/validate/serve_pool.py"))
        .args(args)
        .output()
        .unwrap()
}

fn stdout(o: &Output) -> String {
    assert!(o.status.success(), "serve_pool.py failed: {}", describe(o));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// serve_pool.py's tables for the kept calls `calls` of samples/h200/serve-turns.
fn pooled(calls: impl IntoIterator<Item = u32>) -> String {
    let dir = root().join("samples/h200/serve-turns");
    let calls: Vec<PathBuf> = calls
        .into_iter()
        .map(|n| dir.join(format!("call{n}.tsv")))
        .collect();
    stdout(&serve_pool(
        &calls.iter().map(|p| p.as_path()).collect::<Vec<_>>(),
    ))
}

fn assert_rows(out: &str, rows: &[&str]) {
    for row in rows {
        assert!(out.contains(row), "no row {row:?} in:\n{out}");
    }
    assert!(!out.contains("left out"), "{out}");
}

#[test]
fn serve_pool_gives_the_documented_serve_table() {
    if !vramtrace_testkit::python3_or_skip() {
        return;
    }
    // One toggled server a call, beside bare, vramtrace, recorder and noprobe servers (the day).
    assert_rows(
        &pooled(2..=4),
        &[
            "| toggled:on / toggled:off | 42 | 1.017 | 1.008 – 1.045 | 14 / 42 |",
            "| toggled:history / toggled:off | 42 | 1.077 | 1.022 – 1.144 | 10 / 42 |",
            "| toggled:on / toggled:history | 42 | 0.950 | 0.907 – 0.979 | 27 / 42 |",
            "| noprobe / bare | 42 | 0.980 | 0.965 – 1.014 | 23 / 42 |",
        ],
    );
    // Three toggled servers a call (the evening): their turns pooled, and against bare.
    assert_rows(
        &pooled(6..=9),
        &[
            "| toggled*:on / toggled*:off | 144 | 1.008 | 1.002 – 1.015 | 58 / 144 |",
            "| toggled*:history / toggled*:off | 27 | 1.030 | 1.003 – 1.100 | 8 / 27 |",
            "| toggled*:on / toggled*:history | 27 | 0.967 | 0.924 – 0.992 | 20 / 27 |",
            "| toggled*:off / bare | 36 | 0.976 | 0.965 – 0.995 | 23 / 36 |",
            "| toggled*:on / bare | 36 | 0.978 | 0.967 – 1.004 | 23 / 36 |",
        ],
    );
}

#[test]
fn serve_pool_pools_toggled_servers_and_leaves_failed_batches_out() {
    if !vramtrace_testkit::python3_or_skip() {
        return;
    }
    let d = scratch("serve-pool");
    // Two toggled servers; recording costs 10% in the first and 30% in the second; round 3's
    // bare batch failed.
    let mut tsv = String::new();
    for r in 1..=3 {
        let bare = if r == 3 {
            "nan".to_string()
        } else {
            "2.0".into()
        };
        tsv += &format!("bare {r} {bare}\n");
        tsv += &format!("toggled:off {r} 2.0\ntoggled:on {r} 2.2\ntoggled:history {r} 2.4\n");
        tsv += &format!("toggled2:off {r} 1.0\ntoggled2:on {r} 1.3\ntoggled2:history {r} 1.3\n");
    }
    let f = d.join("call.tsv");
    std::fs::write(&f, tsv).unwrap();
    let out = stdout(&serve_pool(&[f.as_path()]));
    for row in [
        "| toggled:on / toggled:off | 3 | 1.100 |",
        "| toggled2:on / toggled2:off | 3 | 1.300 |",
        "| toggled*:on / toggled*:off | 6 | 1.200 |",
        "| toggled:on / bare | 2 | 1.100 |",
        "| toggled*:on / bare | 4 | 0.875 |",
        "bare: 1 batch(es) had a failed request and are left out",
    ] {
        assert!(out.contains(row), "no row {row:?} in:\n{out}");
    }

    std::fs::write(&f, "bare 1 2.0\ntoggled:on 1\n").unwrap();
    let o = serve_pool(&[f.as_path()]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "a malformed line was accepted");
    assert!(
        err.contains("call.tsv:2: expected 'SLOT ROUND SECONDS'"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&d);
}
