//! Finding the preload library and running a program under it.

use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};
use std::process::ExitStatus;

use anyhow::{Context, bail};
use vramtrace_models::units::fmt_bytes;

/// File name of the preload library.
pub const PRELOAD_FILE: &str = "libvramtrace_preload.so";

/// Recording options passed to the preload through its environment.
#[derive(Debug, Clone, Copy)]
pub struct Options {
    /// Capture native stacks.
    pub stacks: bool,
}

/// File name of the stand-in driver as cargo builds it (`testbed/fakecuda`).
pub const STAND_IN_FILE: &str = "libcuda.so";

/// Finds the preload: the explicit path if given, else next to the running binary (the same
/// `target/` directory after `cargo build`), else `../lib/` beside it (an installed layout).
pub fn locate(explicit: Option<&Path>) -> anyhow::Result<PathBuf> {
    if let Some(p) = explicit {
        if p.is_file() {
            return std::path::absolute(p)
                .with_context(|| format!("cannot resolve {}", p.display()));
        }
        bail!(
            "the preload library {} does not exist (from --preload or VRAMTRACE_PRELOAD)",
            p.display()
        );
    }
    beside_binary(PRELOAD_FILE).map_err(|tried| {
        anyhow::anyhow!(
            "cannot find {PRELOAD_FILE} (looked in {tried}). Build it with `cargo build --release --workspace` \
             (it lands next to the vramtrace binary), or pass --preload PATH or set VRAMTRACE_PRELOAD."
        )
    })
}

/// A library shipped beside the `vramtrace` binary: in its directory (the `target/` directory
/// after `cargo build`), in `../lib/` (an installed layout) or one level up. The error lists
/// where it looked.
fn beside_binary(file: &str) -> Result<PathBuf, String> {
    let exe = std::env::current_exe().map_err(|e| format!("nowhere: no own path ({e})"))?;
    let dir = exe.parent().unwrap_or(Path::new("."));
    let mut tried = Vec::new();
    for cand in [
        dir.join(file),
        dir.join("../lib").join(file),
        dir.join("..").join(file),
    ] {
        if cand.is_file() {
            return Ok(cand.canonicalize().unwrap_or(cand));
        }
        tried.push(cand.display().to_string());
    }
    Err(tried.join(", "))
}

/// Environment that makes a program load vramtrace's stand-in driver instead of a GPU's: a
/// `libcuda.so.1` that keeps host-side books and fails with real out-of-memory errors once
/// `capacity` bytes are in use (24 GiB when `None`). The link the loader follows is made in
/// `dir/.stand-in-driver`; an existing `LD_LIBRARY_PATH` stays searched after it.
pub fn stand_in_env(
    dir: &Path,
    capacity: Option<u64>,
) -> anyhow::Result<Vec<(OsString, OsString)>> {
    let lib = beside_binary(STAND_IN_FILE).map_err(|tried| {
        anyhow::anyhow!(
            "the stand-in driver {STAND_IN_FILE} is missing (looked in {tried}): build it with \
             `cargo build --release --workspace`"
        )
    })?;
    let lib_dir = dir.join(".stand-in-driver");
    std::fs::create_dir_all(&lib_dir)
        .with_context(|| format!("cannot create {}", lib_dir.display()))?;
    let link = lib_dir.join("libcuda.so.1");
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink(&lib, &link)
        .with_context(|| format!("cannot link {} to {}", link.display(), lib.display()))?;
    let mut search = lib_dir.into_os_string();
    if let Some(old) = std::env::var_os("LD_LIBRARY_PATH").filter(|v| !v.is_empty()) {
        search.push(":");
        search.push(old);
    }
    let mut env = vec![("LD_LIBRARY_PATH".into(), search)];
    if let Some(bytes) = capacity {
        env.push(("VRAMTRACE_FAKE_CAPACITY".into(), bytes.to_string().into()));
        env.push((
            "VRAMTRACE_FAKE_NAME".into(),
            format!("stand-in {} card", fmt_bytes(bytes)).into(),
        ));
    }
    Ok(env)
}

/// `LD_PRELOAD` with the preload appended to whatever the caller already preloads.
pub fn ld_preload_value(existing: Option<&OsStr>, preload: &Path) -> OsString {
    let mut v = OsString::new();
    if let Some(e) = existing.filter(|e| !e.is_empty()) {
        v.push(e);
        v.push(":");
    }
    v.push(preload.as_os_str());
    v
}

/// `command` set up to run with the preload recording into `dir`, with extra environment `env`
/// (not started): the recorder appended to `LD_PRELOAD`, the trace directory, the stack option,
/// and the preload as NVTX's injection library unless the caller chose one.
pub fn traced_command(
    preload: &Path,
    dir: &Path,
    command: &[OsString],
    env: &[(OsString, OsString)],
    opts: Options,
) -> anyhow::Result<std::process::Command> {
    let Some((prog, args)) = command.split_first() else {
        bail!("no command given to run");
    };
    let mut cmd = std::process::Command::new(prog);
    cmd.args(args);
    cmd.env(
        "LD_PRELOAD",
        ld_preload_value(std::env::var_os("LD_PRELOAD").as_deref(), preload),
    );
    cmd.env("VRAMTRACE_DIR", dir);
    cmd.env("VRAMTRACE_STACKS", if opts.stacks { "1" } else { "0" });
    if std::env::var_os("NVTX_INJECTION64_PATH").is_none() {
        cmd.env("NVTX_INJECTION64_PATH", preload);
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    Ok(cmd)
}

/// Runs `command` with the preload recording into `dir` (see [`traced_command`]) and waits for
/// it. Interrupts (Ctrl-C) reach the program, not vramtrace, so the summary still prints after
/// it exits.
pub fn run_traced(
    preload: &Path,
    dir: &Path,
    command: &[OsString],
    env: &[(OsString, OsString)],
    opts: Options,
) -> anyhow::Result<ExitStatus> {
    let mut cmd = traced_command(preload, dir, command, env, opts)?;
    let prog = command[0].to_string_lossy();
    let mut child = cmd
        .spawn()
        .with_context(|| format!("cannot start {prog}"))?;
    let _guard = IgnoreInterrupts::new();
    child.wait().with_context(|| format!("waiting for {prog}"))
}

/// Ignores SIGINT and SIGQUIT while alive (as a shell does while it waits for a job), restoring
/// the previous dispositions on drop.
struct IgnoreInterrupts {
    old: [libc::sighandler_t; 2],
}

impl IgnoreInterrupts {
    fn new() -> Self {
        // Safety: signal() with SIG_IGN is async-signal-safe and affects only this process; the
        // child was already spawned, so it keeps its default dispositions.
        let old = unsafe {
            [
                libc::signal(libc::SIGINT, libc::SIG_IGN),
                libc::signal(libc::SIGQUIT, libc::SIG_IGN),
            ]
        };
        IgnoreInterrupts { old }
    }
}

impl Drop for IgnoreInterrupts {
    fn drop(&mut self) {
        // Safety: restores the dispositions saved in new().
        unsafe {
            libc::signal(libc::SIGINT, self.old[0]);
            libc::signal(libc::SIGQUIT, self.old[1]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn appends_to_existing_preload() {
        let p = Path::new("/x/libvramtrace_preload.so");
        assert_eq!(ld_preload_value(None, p), "/x/libvramtrace_preload.so");
        assert_eq!(
            ld_preload_value(Some("".as_ref()), p),
            "/x/libvramtrace_preload.so"
        );
        assert_eq!(
            ld_preload_value(Some("/a.so".as_ref()), p),
            "/a.so:/x/libvramtrace_preload.so"
        );
    }
}
