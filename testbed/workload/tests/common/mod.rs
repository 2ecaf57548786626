//! What the workload's end-to-end tests share, in one place: the stand-in
//! driver and the preload (built once per test binary by `vramtrace-testkit`,
//! which panics with cargo's output when a build fails), running the binary
//! on them, saying what happened, and skipping visibly when a prerequisite is
//! genuinely missing.
// Each test binary uses part of it.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

/// A small hybrid model: two GDN layers and two attention layers,
/// alternating (full_attention_interval 2).
pub const TINY_CONFIG: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/tiny/config.json");

/// Say this test cannot run here and why, where a plain `cargo test` shows
/// it; fails instead when the variable `require` is `1` (CI sets the ones it
/// provides for).
pub fn skipped(require: &str, why: &str) {
    vramtrace_testkit::skip(require, why);
}

/// The workload binary cargo built for these tests.
pub fn bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_vramtrace-workload"))
}

/// The directory holding the stand-in driver as `libcuda.so` and
/// `libcuda.so.1` (the name cudarc's loader tries next), built for this test
/// binary. `cargo test` builds this package's binary but not other packages'
/// cdylibs, so a stale stand-in would otherwise be tested silently.
pub fn libs() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(vramtrace_testkit::stand_in_dir)
}

/// The preload library, built for this test binary.
pub fn preload() -> PathBuf {
    vramtrace_testkit::preload()
}

/// The binary with the driver taken from `lib_dir`, no preload, and the
/// stand-in's capacity set to `capacity` (its default when `None`).
pub fn command(lib_dir: &Path, capacity: Option<&str>) -> Command {
    let mut cmd = Command::new(bin());
    cmd.env("LD_LIBRARY_PATH", lib_dir)
        .env_remove("LD_PRELOAD")
        .env_remove("VRAMTRACE_FAKE_DEVICES")
        .env_remove("VRAMTRACE_FAKE_CAPACITY");
    if let Some(c) = capacity {
        cmd.env("VRAMTRACE_FAKE_CAPACITY", c);
    }
    cmd
}

/// Run the binary with `args` (see [`command`]).
pub fn run(lib_dir: &Path, capacity: Option<&str>, args: &[&str]) -> Output {
    command(lib_dir, capacity)
        .args(args)
        .output()
        .expect("the workload binary runs")
}

/// Status, stdout and stderr, for an assertion message.
pub fn describe(o: &Output) -> String {
    vramtrace_testkit::describe(o)
}
