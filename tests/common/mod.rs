//! Helpers for the end-to-end tests: the real CLI, the real preload and the stand-in driver,
//! all from this workspace's target directory.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The `vramtrace` binary under test.
pub fn vramtrace() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_vramtrace"))
}

/// The target directory holding the binary, the preload, the stand-in driver and the workload,
/// all built first (see `vramtrace_testkit::build`).
pub fn target_dir() -> PathBuf {
    vramtrace_testkit::build(&[
        "-p",
        "vramtrace-preload",
        "-p",
        "vramtrace-fakecuda",
        "-p",
        "vramtrace-workload",
    ]);
    vramtrace_testkit::profile_dir()
}

/// The preload library under test.
pub fn preload() -> PathBuf {
    target_dir().join("libvramtrace_preload.so")
}

/// A directory holding the stand-in driver as `libcuda.so.1` and `libcuda.so`, for
/// `LD_LIBRARY_PATH` and `-L`.
pub fn fake_driver_dir() -> PathBuf {
    target_dir();
    vramtrace_testkit::stand_in_dir()
}

pub use vramtrace_testkit::{describe, scratch};

/// Compiles a C test program (linked against the stand-in driver when `link_cuda`): one of
/// `tests/c/` or, shared with the preload's own tests, `probes/preload/tests/c/`.
pub fn c_program(name: &str, link_cuda: bool) -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let shared = root.join("probes/preload/tests/c");
    let src = [root.join("tests/c"), shared.clone()]
        .into_iter()
        .map(|d| d.join(format!("{name}.c")))
        .find(|p| p.is_file())
        .unwrap_or_else(|| panic!("no C test program {name}.c"));
    let out = scratch(&format!("cc-{name}")).join(name);
    let mut cc = Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".into()));
    cc.arg("-O1")
        .arg("-g")
        .arg("-I")
        .arg(&shared)
        .arg("-o")
        .arg(&out)
        .arg(&src)
        .arg("-lpthread")
        .arg("-ldl");
    if link_cuda {
        cc.arg("-L").arg(fake_driver_dir()).arg("-lcuda");
    }
    let o = cc
        .output()
        .expect("a C compiler (cc) is needed for the end-to-end tests");
    assert!(
        o.status.success(),
        "compiling {}: {}",
        src.display(),
        String::from_utf8_lossy(&o.stderr)
    );
    out
}

/// `vramtrace run --out DIR -- program...` on the stand-in driver with `capacity` bytes.
pub fn run_traced(out: &Path, capacity: &str, program: &[&std::ffi::OsStr]) -> Output {
    Command::new(vramtrace())
        .arg("run")
        .arg("--out")
        .arg(out)
        .arg("--")
        .args(program)
        .env("LD_LIBRARY_PATH", fake_driver_dir())
        .env("VRAMTRACE_FAKE_CAPACITY", capacity)
        .env_remove("LD_PRELOAD")
        .output()
        .unwrap()
}

/// `vramtrace events PATH` parsed into JSON values.
pub fn events(path: &Path) -> Vec<serde_json::Value> {
    let o = Command::new(vramtrace())
        .arg("events")
        .arg(path)
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "vramtrace events failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8(o.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// `(kind, api, size)` of every event, for exact comparisons.
pub fn kinds_apis_sizes(ev: &[serde_json::Value]) -> Vec<(String, String, u64)> {
    ev.iter()
        .map(|e| {
            (
                e["kind"].as_str().unwrap().to_string(),
                e["api"].as_str().unwrap().to_string(),
                e["size"].as_u64().unwrap(),
            )
        })
        .collect()
}

/// Shorthand for one expected event.
pub fn e(kind: &str, api: &str, size: u64) -> (String, String, u64) {
    (kind.to_string(), api.to_string(), size)
}

pub const MIB: u64 = 1 << 20;

/// The model config the tests compare against (samples/models/Qwen3.6-27B).
pub const QWEN_CONFIG: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/samples/models/Qwen3.6-27B/config.json"
);

/// `vramtrace compare DIR --model Qwen3.6-27B --variant fla-0.6.0 --tokens 4128 EXTRA...`.
pub fn compare_fla(dir: &Path, extra: &[&str]) -> Output {
    Command::new(vramtrace())
        .arg("compare")
        .arg(dir)
        .args([
            "--model",
            QWEN_CONFIG,
            "--variant",
            "fla-0.6.0",
            "--tokens",
            "4128",
        ])
        .args(extra)
        .output()
        .unwrap()
}
