//! `vramtrace snapshot PID`: asks a traced process for a flight record (its live tensors with
//! their stacks, written into its trace beside the ring) by sending it `SIGUSR2`, which the
//! preload catches once it keeps a live-tensor table (under a size budget, as `vramtrace run`
//! sets by default).

use anyhow::bail;

/// Arguments of `vramtrace snapshot`.
#[derive(clap::Args, Debug)]
#[command(
    after_help = "The process writes a NOTE `flight record: SIGUSR2 (vramtrace snapshot): N live tensors, B bytes`\nand one record per live tensor into its trace file at once (or at its next tensor event if\nthe signal arrives while it is inside the recorder). `vramtrace summary DIR` then shows the\nlive set of that moment even where the size budget dropped the tensor events that made it."
)]
pub struct SnapshotArgs {
    /// The traced process.
    pub pid: u32,
}

/// Runs `vramtrace snapshot`.
pub fn run(args: SnapshotArgs) -> anyhow::Result<i32> {
    let pid = args.pid;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).map_err(|e| {
        anyhow::anyhow!("cannot read /proc/{pid}/status ({e}): is process {pid} running?")
    })?;
    // SigCgt: the signals the process catches, a hexadecimal mask (bit n-1 for signal n).
    let caught = status
        .lines()
        .find_map(|l| l.strip_prefix("SigCgt:"))
        .and_then(|m| u64::from_str_radix(m.trim(), 16).ok())
        .unwrap_or(0);
    if caught & (1 << (libc::SIGUSR2 - 1)) == 0 {
        bail!(
            "process {pid} does not catch SIGUSR2, so it is not keeping a live-tensor table \
             (it is not traced, has not reported a tensor yet, runs without a size budget, or \
             uses SIGUSR2 itself); sending it would kill it, so nothing was sent. Trace it with \
             `vramtrace run` (whose --max-size is on by default)."
        );
    }
    // Safety: kill with a pid and a signal number.
    if unsafe { libc::kill(pid as libc::pid_t, libc::SIGUSR2) } != 0 {
        bail!(
            "cannot signal process {pid}: {}",
            std::io::Error::last_os_error()
        );
    }
    eprintln!("vramtrace: asked process {pid} for a flight record (SIGUSR2)");
    Ok(0)
}
