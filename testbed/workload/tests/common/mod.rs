//! What the binary's end-to-end tests share: finding the binary, running it
//! on a given driver directory, and saying what happened.
// Each test binary uses part of it.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// A small hybrid model: two GDN layers and two attention layers,
/// alternating (full_attention_interval 2).
pub const TINY_CONFIG: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/tiny/config.json");

/// Say a test skipped where a plain `cargo test` shows it: libtest captures
/// `println!`, not writes to the stderr handle.
pub fn skipped(why: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "SKIPPED {why}");
}

/// The workload binary cargo built for these tests.
pub fn bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_vramtrace-workload"))
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
    format!(
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}
