//! With the `wheel` feature only (pyproject.toml turns it on for maturin): builds the preload
//! (`probes/preload`) for the same target, in release, and stages it with the Python probe
//! under `python/vramtrace/`, the package maturin packs beside the `vramtrace` binary:
//!
//! ```text
//! python/vramtrace/libvramtrace_preload.so
//! python/vramtrace/python/{vramtrace_probe.py, vramtrace_torch.py, autostart/sitecustomize.py}
//! ```
//!
//! The preload is built by a second cargo with its own target directory (under `OUT_DIR`), so
//! it never waits on the outer build's lock; it inherits the outer build's environment, so a
//! `maturin build --zig` links it with the same zig and glibc version as the CLI. Without the
//! feature this script does nothing.

use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    println!("cargo::rerun-if-changed=build.rs");
    if std::env::var_os("CARGO_FEATURE_WHEEL").is_none() {
        return;
    }
    let root = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"));
    for p in [
        "Cargo.lock",
        "probes/preload/Cargo.toml",
        "probes/preload/src",
        "probes/format/Cargo.toml",
        "probes/format/src",
        "probes/python/vramtrace_probe.py",
        "probes/python/vramtrace_torch.py",
        "probes/python/autostart/sitecustomize.py",
    ] {
        println!("cargo::rerun-if-changed={p}");
    }
    let target = std::env::var("TARGET").expect("TARGET");
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("OUT_DIR"));
    let target_dir = out.join("preload-target");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let status = Command::new(cargo)
        .current_dir(&root)
        .args(["build", "--release", "-p", "vramtrace-preload", "--target"])
        .arg(&target)
        .arg("--target-dir")
        .arg(&target_dir)
        // The inner cargo's own output is not for the outer one's directive parser.
        .stdout(std::io::stderr())
        .status()
        .expect("cannot start cargo to build the preload");
    assert!(
        status.success(),
        "building the preload for the wheel failed"
    );

    let pkg = root.join("python/vramtrace");
    let built = target_dir
        .join(&target)
        .join("release/libvramtrace_preload.so");
    stage(&built, &pkg.join("libvramtrace_preload.so"));
    for f in [
        "vramtrace_probe.py",
        "vramtrace_torch.py",
        "autostart/sitecustomize.py",
    ] {
        stage(
            &root.join("probes/python").join(f),
            &pkg.join("python").join(f),
        );
    }
}

/// Copies `from` to `to` through a temporary name, so a reader never sees half a file.
fn stage(from: &Path, to: &Path) {
    std::fs::create_dir_all(to.parent().unwrap()).expect("create the staging directory");
    let tmp = to.with_extension("staging");
    std::fs::copy(from, &tmp)
        .unwrap_or_else(|e| panic!("cannot copy {} to {}: {e}", from.display(), tmp.display()));
    std::fs::rename(&tmp, to).unwrap_or_else(|e| panic!("cannot rename to {}: {e}", to.display()));
}
