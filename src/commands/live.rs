//! `vramtrace live DIR` and `vramtrace run --live`: the live terminal view over a trace
//! directory (see [`crate::live`] for how it is followed).

use std::ffi::OsString;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::{Child, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, bail};

use crate::commands::run::{RunArgs, check_writable, new_out_dir, prepare_out_dir, report_exit};
use crate::live::{DirSource, LiveOptions};
use crate::preload;
use crate::summary::{SummaryOptions, render, summarize};
use crate::trace::Trace;
use vramtrace_models::units::parse_bytes;
use vramtrace_viewer::model::{LiveSnapshot, SnapshotQuery, Update};
use vramtrace_viewer::tui::{self, LiveSource, RunOptions, ViewOptions};

/// Arguments of `vramtrace live`.
#[derive(clap::Args, Debug)]
#[command(
    after_help = "Examples:\n  vramtrace live trace-dir                 # a running job's directory, or a finished one\n  vramtrace live trace-dir --capacity 24GiB\n  vramtrace run --live -- python3 serve.py # record and watch in one terminal\n\nEvery *.vtr file of the directory is followed, new ones as they appear (workers, ranks).\nKeys: ? for help, q to quit."
)]
pub struct LiveArgs {
    /// The trace directory (it may still be empty: the view waits for files).
    pub dir: PathBuf,
    /// Draw a capacity line at this many bytes, e.g. `24GiB`.
    #[arg(long, value_name = "BYTES", value_parser = parse_bytes)]
    pub capacity: Option<u64>,
    /// How many of the largest live allocations to list.
    #[arg(long, default_value_t = 40)]
    pub top: usize,
    /// Do not ask NVML for device memory.
    #[arg(long)]
    pub no_nvml: bool,
}

/// Runs `vramtrace live`.
pub fn run(args: LiveArgs) -> anyhow::Result<i32> {
    if !std::io::stdout().is_terminal() || !std::io::stdin().is_terminal() {
        bail!(
            "vramtrace live draws in a terminal; stdin and stdout must be one. For text, use `vramtrace summary {}`",
            args.dir.display()
        );
    }
    let mut source = DirSource::new(
        &args.dir,
        LiveOptions {
            top: args.top,
            nvml: !args.no_nvml,
            ..LiveOptions::default()
        },
    );
    view(&mut source, &args.dir, args.capacity)?;
    Ok(0)
}

/// Shows the live view of `source` until the user quits.
fn view(source: &mut dyn LiveSource, dir: &Path, capacity: Option<u64>) -> anyhow::Result<()> {
    let options = RunOptions {
        view: ViewOptions {
            title: dir.display().to_string(),
            capacity_bytes: capacity,
            ..ViewOptions::default()
        },
        tick: Duration::from_millis(100),
    };
    tui::run(source, &options).context("the live view failed")
}

/// The directory source, plus one notice when the traced command exits.
struct RunSource {
    inner: DirSource,
    status: Arc<Mutex<Option<ExitStatus>>>,
    said: bool,
    command: String,
    log: PathBuf,
}

impl LiveSource for RunSource {
    fn poll(&mut self) -> Vec<Update> {
        let mut u = self.inner.poll();
        if !self.said
            && let Some(st) = *self.status.lock().unwrap_or_else(|e| e.into_inner())
        {
            self.said = true;
            let how = match (
                st.code(),
                std::os::unix::process::ExitStatusExt::signal(&st),
            ) {
                (Some(c), _) => format!("exit {c}"),
                (None, Some(s)) => format!("signal {s}"),
                _ => "ended".to_string(),
            };
            let prog = Path::new(&self.command)
                .file_name()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_else(|| self.command.clone());
            u.push(Update::Notice(format!(
                "{prog} exited ({how}), output in {}; q quits",
                self.log.display()
            )));
        }
        u
    }

    fn snapshot(&mut self, query: &SnapshotQuery) -> Option<LiveSnapshot> {
        self.inner.snapshot(query)
    }
}

/// Starts `command` with the recorder preloaded into `dir` (see [`preload::traced_command`]),
/// its stdin empty and its stdout and stderr in `log`.
fn spawn_traced(
    preload_lib: &Path,
    dir: &Path,
    command: &[OsString],
    env: &[(OsString, OsString)],
    stacks: bool,
    log: &Path,
) -> anyhow::Result<Child> {
    let mut cmd =
        preload::traced_command(preload_lib, dir, command, env, preload::Options { stacks })?;
    let out = std::fs::File::create(log)
        .with_context(|| format!("cannot create the log file {}", log.display()))?;
    let err = out
        .try_clone()
        .with_context(|| format!("cannot reopen {}", log.display()))?;
    cmd.stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn()
        .with_context(|| format!("cannot start {}", command[0].to_string_lossy()))
}

/// The log file of `vramtrace run --live`, in the trace directory.
pub const LOG_FILE: &str = "command.log";

/// `vramtrace run --live`: runs the command under the recorder and shows the live view in this
/// terminal; the command's output goes to [`LOG_FILE`] in the trace directory. The view stays
/// after the command exits until the user quits; quitting while it still runs waits for it
/// (Ctrl-C then reaches it). Returns `None` when stdin or stdout is not a terminal: the caller
/// then runs the command the ordinary way.
pub fn run_live(args: &RunArgs) -> anyhow::Result<Option<i32>> {
    if !std::io::stdout().is_terminal() || !std::io::stdin().is_terminal() {
        eprintln!("vramtrace: --live needs a terminal; running without the live view");
        return Ok(None);
    }
    let preload_lib = preload::locate(args.preload.as_deref())?;
    let out = match &args.out {
        Some(dir) => prepare_out_dir(dir)?,
        None => new_out_dir(&args.command[0])?,
    };
    let env = if args.simulate {
        preload::stand_in_env(&out, args.capacity)?
    } else {
        Vec::new()
    };
    check_writable(&out)?;
    let log = out.join(LOG_FILE);
    let mut child = spawn_traced(
        &preload_lib,
        &out,
        &args.command,
        &env,
        !args.no_stacks,
        &log,
    )?;
    let status = Arc::new(Mutex::new(None));
    let waiter = {
        let status = status.clone();
        std::thread::spawn(move || -> std::io::Result<ExitStatus> {
            let st = child.wait()?;
            *status.lock().unwrap_or_else(|e| e.into_inner()) = Some(st);
            Ok(st)
        })
    };
    let mut source = RunSource {
        inner: DirSource::new(&out, LiveOptions::default()),
        status: status.clone(),
        said: false,
        command: args.command[0].to_string_lossy().into_owned(),
        log: log.clone(),
    };
    let shown = view(&mut source, &out, args.capacity);
    if status.lock().unwrap_or_else(|e| e.into_inner()).is_none() {
        eprintln!(
            "vramtrace: waiting for {} to exit (Ctrl-C interrupts it)",
            args.command[0].to_string_lossy()
        );
    }
    let _guard = IgnoreInterrupts::new();
    let st = waiter
        .join()
        .map_err(|_| anyhow::anyhow!("the thread waiting for the command panicked"))?
        .with_context(|| format!("waiting for {}", args.command[0].to_string_lossy()))?;
    shown?;
    let code = report_exit(&args.command[0], st);
    eprintln!("vramtrace: trace written to {}", out.display());
    eprintln!("vramtrace: the command's output is in {}", log.display());
    if !args.quiet {
        match Trace::open(&out).and_then(|t| summarize(&t, SummaryOptions::default())) {
            Ok(s) => eprint!("{}", render(&s, false)),
            Err(e) => eprintln!("vramtrace: {e:#}"),
        }
    }
    Ok(Some(code))
}

/// Ignores SIGINT and SIGQUIT while alive, as a shell does while it waits for a job (the
/// command, in the same process group, still gets them); restores them on drop.
struct IgnoreInterrupts {
    old: [libc::sighandler_t; 2],
}

impl IgnoreInterrupts {
    fn new() -> Self {
        // Safety: signal() with SIG_IGN affects only this process and has no precondition.
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
        // Safety: puts back the dispositions read in new().
        unsafe {
            libc::signal(libc::SIGINT, self.old[0]);
            libc::signal(libc::SIGQUIT, self.old[1]);
        }
    }
}
