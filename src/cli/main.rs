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
    let cli = crate::args::Cli::parse();
    match crate::args::dispatch(cli) {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            eprintln!("vramtrace: error: {e:#}");
            std::process::exit(2);
        }
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
