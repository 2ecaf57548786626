//! `vramtrace run`: runs a program with the preload, waits, prints a per-process summary and
//! exits with the program's exit code.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};

use crate::launch;
use vramtrace::summary::{SummaryOptions, render, summarize};
use vramtrace::trace::Trace;
use vramtrace_models::units::parse_bytes;

/// Arguments of `vramtrace run`.
#[derive(clap::Args, Debug)]
#[command(
    after_help = "Examples:\n  vramtrace run -- python3 serve.py --model Qwen/Qwen3.6-27B\n  vramtrace run --out oom-trace -- ./llama-server -m model.gguf\n  vramtrace run --simulate --capacity 24GiB -- ./prog      # no GPU: the stand-in driver\n\nEvery process the program starts (workers, forks, exec'd children) is recorded into the same\ndirectory, one file per process. Read it with `vramtrace summary DIR` or `vramtrace events DIR`."
)]
pub struct RunArgs {
    /// Directory to write the trace into. It is created; an existing directory must be empty.
    /// Default: a new directory `vramtrace-<program>-<UTC time>` in the current directory.
    #[arg(long, short)]
    pub out: Option<PathBuf>,
    /// The preload library. Default: `libvramtrace_preload.so` next to this binary.
    #[arg(long, env = "VRAMTRACE_PRELOAD", value_name = "PATH")]
    pub preload: Option<PathBuf>,
    /// Do not capture native stacks (faster, smaller traces).
    #[arg(long)]
    pub no_stacks: bool,
    /// Do not start the PyTorch probe. By default a Python program that imports torch records
    /// each tensor the caching allocator hands out and takes back, with its Python line, and
    /// the allocator's own out-of-memory errors (probes/python/vramtrace_torch.py, put on
    /// PYTHONPATH; nothing changes in a program that never imports torch). It starts in every
    /// Python process of the run once torch has been imported, whatever looked for torch
    /// first and whichever thread allocates, in multiprocessing and torchrun workers too; where
    /// it cannot, it says why on stderr and `summary` says so per process.
    #[arg(long)]
    pub no_torch_probe: bool,
    /// Also describe each PyTorch operator's output tensors by the operator, shape and dtype
    /// (`empty_like [1, 4128, 48, 128] bfloat16`): not a name, so `compare` still matches them by
    /// size and counts an equal shape and dtype as evidence. Slower: a Python call per operator
    /// (a `torch.empty` + `del` took 26 µs on an H200 with it, 13 µs without, 2–4 µs untraced).
    #[arg(long, conflicts_with = "no_torch_probe")]
    pub torch_shapes: bool,
    /// Keep each process's trace file within BYTES (`0`: no limit). Tensor-level records
    /// (PyTorch's blocks handed out and taken back) go into a ring: once the file would pass
    /// the budget, the oldest of them are dropped, 64 KiB at a time, and `summary` says which
    /// time range lost them. Driver events, failures, notes and the live tensors are never
    /// dropped (a tensor still live when its record goes is restated), and at every failed
    /// allocation, every refusal of PyTorch's allocator, and on `vramtrace snapshot PID`, the
    /// whole live tensor set with its stacks is written beside the ring. Measured on the H200
    /// (docs/performance.md): a decode step of an 8-layer hybrid Qwen3.5 writes 33 KB (1,129
    /// tensor events of 29.6 bytes), so the default of 4GiB holds some 145 million events,
    /// about 130,000 such steps: a day of decoding at 5 steps a second (14 GB unbounded)
    /// keeps its last 7 hours of tensor detail; `--max-size 16GiB` keeps the whole day.
    #[arg(long, value_name = "BYTES", value_parser = parse_bytes, default_value = "4GiB")]
    pub max_size: u64,
    /// Run the program against vramtrace's stand-in driver instead of a GPU: a `libcuda.so.1`
    /// that keeps host-side books and fails with real out-of-memory errors. No GPU needed.
    #[arg(long)]
    pub simulate: bool,
    /// With --simulate: the stand-in card's memory, e.g. `24GiB` (the default) or `23.5GiB`.
    #[arg(long, requires = "simulate", value_name = "BYTES", value_parser = parse_bytes)]
    pub capacity: Option<u64>,
    /// Show the live view in this terminal while the program runs (its output goes to
    /// `command.log` in the trace directory). Without a terminal, runs as usual.
    #[arg(long)]
    pub live: bool,
    /// Do not print the summary when the program exits.
    #[arg(long, short)]
    pub quiet: bool,
    /// The program and its arguments.
    #[arg(last = true, required = true, value_name = "CMD")]
    pub command: Vec<OsString>,
}

/// Runs `vramtrace run`.
pub fn run(args: RunArgs) -> anyhow::Result<i32> {
    let preload = launch::locate(args.preload.as_deref())?;
    let out = match &args.out {
        Some(dir) => crate::trace_dir::prepare_out_dir(dir)?,
        None => crate::trace_dir::new_out_dir(&args.command[0])?,
    };
    let opts = launch::Options {
        stacks: !args.no_stacks,
    };
    let mut env = if args.simulate {
        launch::stand_in_env(&out, args.capacity)?
    } else {
        Vec::new()
    };
    env.extend(torch_probe_env(&preload, &args)?);
    env.push((
        "VRAMTRACE_MAX_SIZE".into(),
        args.max_size.to_string().into(),
    ));
    check_writable(&out)?;
    crate::commands::versions::write(&out, &args.command, &env);
    let pipe = StatusPipe::new()?;
    env.push(pipe.env());
    let status = if args.live && crate::commands::live::terminal_ok() {
        let cmd = launch::traced_command(&preload, &out, &args.command, &env, opts)?;
        crate::commands::live::run_with_view(cmd, &args.command[0], &out, args.capacity)?
    } else {
        launch::run_traced(&preload, &out, &args.command, &env, opts)?
    };
    let stopped = pipe.finish();
    let code = report_exit(&args.command[0], status);
    let has_trace = holds_trace_file(&out);
    if !has_trace && stopped.is_empty() {
        // Never claim a trace that is not there. A program that made no CUDA call leaves none
        // and keeps its own exit code: it ran unchanged.
        eprintln!(
            "vramtrace: no trace file was written to {}: the program made no CUDA allocation call the recorder saw",
            out.display()
        );
        return Ok(code);
    }
    if has_trace {
        let trace = Trace::open(&out);
        // Name the native frames now, while the program's libraries are on this machine: the
        // trace may be read elsewhere, or after they are gone.
        let stored = match &trace {
            Ok(t) => vramtrace::symbolize::write_stored_symbols(t)
                .err()
                .map(anyhow::Error::from),
            Err(e) => Some(anyhow::anyhow!("{e:#}")),
        };
        if let Some(e) = stored {
            eprintln!("vramtrace: the native frames could not be stored with the trace: {e:#}");
        }
        if !args.quiet {
            eprintln!("vramtrace: trace written to {}", out.display());
            match trace.and_then(|t| summarize(&t, SummaryOptions::default())) {
                Ok(s) => eprint!("{}", render(&s, false)),
                Err(e) => eprintln!("vramtrace: {e:#}"),
            }
        }
    }
    if !stopped.is_empty() {
        let lines: Vec<String> = stopped
            .iter()
            .map(|l| match l.split_once(' ') {
                Some((pid, why)) => format!("  process {pid}: {why}"),
                None => format!("  {l}"),
            })
            .collect();
        bail!(
            "the recorder was loaded but could not record{} (the program exited with {code}):\n{}",
            if has_trace {
                " everything: the trace in it is incomplete"
            } else {
                ""
            },
            lines.join("\n")
        );
    }
    Ok(code)
}

/// The pipe through which the recorder says that it stopped (`VRAMTRACE_STATUS_FD`, read by
/// the preload's `config::report_status`): one line `<pid> <why>` per traced process whose
/// recording failed (the trace file could not be created, the disk filled, a panic).
///
/// A pipe rather than a marker file beside the trace: the commonest reason for not recording
/// is a directory the recorder cannot write, where no marker could be written either, and a
/// pipe leaves nothing in the trace directory for readers to skip. Both ends are non-blocking
/// (a full pipe drops a line, it never stalls the program), the write end is inherited by the
/// program and everything it starts, and the variable names its inode too, so a program that
/// closed the descriptor and reused its number never receives the recorder's line.
struct StatusPipe {
    read: std::fs::File,
    write: Option<std::os::fd::OwnedFd>,
    inode: u64,
}

impl StatusPipe {
    fn new() -> anyhow::Result<StatusPipe> {
        use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
        use std::os::unix::fs::MetadataExt;
        let mut fds = [0; 2];
        // Safety: pipe2 with a valid array of two descriptors and plain flags.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC | libc::O_NONBLOCK) } != 0 {
            return Err(std::io::Error::last_os_error()).context("cannot create a pipe");
        }
        // Safety: both descriptors were just created and are owned by nobody else.
        let (read, write) = unsafe {
            (
                std::fs::File::from_raw_fd(fds[0]),
                OwnedFd::from_raw_fd(fds[1]),
            )
        };
        // The program inherits the write end: clear its close-on-exec flag.
        // Safety: fcntl on a descriptor we own.
        if unsafe { libc::fcntl(write.as_raw_fd(), libc::F_SETFD, 0) } != 0 {
            return Err(std::io::Error::last_os_error()).context("cannot pass a pipe on");
        }
        let inode = read.metadata().context("cannot read the pipe")?.ino();
        Ok(StatusPipe {
            read,
            write: Some(write),
            inode,
        })
    }

    /// `VRAMTRACE_STATUS_FD=<fd>:<inode>`.
    fn env(&self) -> (OsString, OsString) {
        use std::os::fd::AsRawFd;
        let fd = self.write.as_ref().map_or(-1, |w| w.as_raw_fd());
        (
            "VRAMTRACE_STATUS_FD".into(),
            format!("{fd}:{}", self.inode).into(),
        )
    }

    /// After the program exited: closes our write end and reads what the recorders wrote, one
    /// entry per line (at most 64 KiB; a process still alive may write later, unread).
    fn finish(mut self) -> Vec<String> {
        use std::io::Read;
        drop(self.write.take());
        let mut buf = Vec::new();
        let mut chunk = [0u8; 4096];
        while buf.len() < 1 << 16 {
            match self.read.read(&mut chunk) {
                Ok(0) => break,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(_) => break,
            }
        }
        String::from_utf8_lossy(&buf)
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(str::to_string)
            .collect()
    }
}

/// The environment that starts the PyTorch probe in Python programs: its `sitecustomize`
/// directory ahead of `PYTHONPATH`, and `VRAMTRACE_TORCH_SHAPES=1` for `--torch-shapes`.
/// Without the probe's files (an install that lacks them) the program runs without it, unless
/// `--torch-shapes` asked for it.
fn torch_probe_env(preload: &Path, args: &RunArgs) -> anyhow::Result<Vec<(OsString, OsString)>> {
    if args.no_torch_probe {
        return Ok(vec![("VRAMTRACE_TORCH_PROBE".into(), "0".into())]);
    }
    let Some(dir) = crate::launch::torch_probe_dir(preload) else {
        if args.torch_shapes {
            bail!(
                "--torch-shapes needs the Python probe (probes/python/autostart), which is not beside {}: \
                 set VRAMTRACE_PYTHON_PROBE to its directory",
                preload.display()
            );
        }
        return Ok(Vec::new());
    };
    let mut env = vec![(
        "PYTHONPATH".into(),
        launch::searched_first(&dir, "PYTHONPATH"),
    )];
    if args.torch_shapes {
        env.push(("VRAMTRACE_TORCH_SHAPES".into(), "1".into()));
    }
    Ok(env)
}

/// Refuses a trace directory this process cannot create files in (an existing directory of
/// another user, a read-only mount): the program would otherwise run unrecorded. Creates and
/// removes a probe file, which is what the recorder will do.
pub fn check_writable(dir: &Path) -> anyhow::Result<()> {
    let probe = dir.join(format!(".vramtrace-probe-{}", std::process::id()));
    match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&probe)
    {
        Ok(f) => {
            drop(f);
            let _ = std::fs::remove_file(&probe);
            Ok(())
        }
        Err(e) => bail!(
            "cannot write into {} ({e}): the program would run unrecorded; choose a directory you can write with --out",
            dir.display()
        ),
    }
}

/// Whether the trace directory holds at least one trace file.
fn holds_trace_file(dir: &Path) -> bool {
    std::fs::read_dir(dir).is_ok_and(|mut entries| {
        entries.any(|e| {
            e.is_ok_and(|e| {
                e.path()
                    .extension()
                    .is_some_and(|x| x == vramtrace_format::FILE_EXTENSION)
                    // A regular file: a symbolic link planted under a trace file's name is
                    // not one (the recorder refuses it).
                    && e.file_type().is_ok_and(|t| t.is_file())
            })
        })
    })
}

/// Exit code to pass on: the program's, or 128 + signal like a shell.
pub fn report_exit(cmd: &std::ffi::OsStr, status: std::process::ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    if let Some(c) = status.code() {
        return c;
    }
    let sig = status.signal().unwrap_or(0);
    eprintln!(
        "vramtrace: {} was killed by signal {sig}",
        cmd.to_string_lossy()
    );
    128 + sig
}
