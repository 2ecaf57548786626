//! The `vramtrace` command line: parse, hand off to one action per subcommand, exit with its code.

mod args;
mod commands;
mod launch;
mod nvml;
mod progress;
mod trace_dir;

use clap::Parser;

fn main() {
    restore_sigpipe();
    let cli = crate::args::Cli::parse_from(crate::commands::model_llama::spell_ubatch(
        std::env::args_os(),
    ));
    let code = match crate::args::dispatch(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("vramtrace: error: {e:#}");
            2
        }
    };
    say_peak_memory();
    std::process::exit(code);
}

/// With `VRAMTRACE_PEAK_RSS` set, says this process's own peak resident memory on stderr
/// (`VmHWM` of /proc/self/status: the memory of this program since its exec). The benchmarks
/// and the memory tests read it: a spawned child's `ru_maxrss` also counts the memory of the
/// process that spawned it, held until the exec (docs/performance.md).
fn say_peak_memory() {
    if std::env::var_os("VRAMTRACE_PEAK_RSS").is_none() {
        return;
    }
    if let Ok(status) = std::fs::read_to_string("/proc/self/status")
        && let Some(line) = status.lines().find(|l| l.starts_with("VmHWM:"))
    {
        eprintln!(
            "vramtrace: peak resident memory: {}",
            line["VmHWM:".len()..].trim()
        );
    }
}

/// Gives SIGPIPE back its default action, so that `vramtrace summary DIR | head -1` ends the way
/// `cat` does when `head` stops reading, instead of panicking on the next `println!`.
///
/// Rust's runtime ignores SIGPIPE before `main`; every command here writes its output to stdout
/// and has nothing to flush or undo when the reader is gone. `vramtrace run`'s child is not
/// affected: the standard library gives a spawned child the default SIGPIPE action whatever this
/// process does, and the trace files are written by the child, not by this process.
fn restore_sigpipe() {
    // Safety: `signal` with a valid signal number and `SIG_DFL` has no other precondition, and
    // it runs before any other thread exists.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}
