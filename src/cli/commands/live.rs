//! `vramtrace live DIR` and `vramtrace run --live`: the live terminal view over a trace
//! directory (see [`vramtrace::live`] for how it is followed).

use std::ffi::OsStr;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, bail};

use crate::launch;
use vramtrace::live::{DirSource, LiveOptions};
use vramtrace_models::units::parse_bytes;
use vramtrace_viewer::model::{LiveSnapshot, SnapshotQuery, Update};
use vramtrace_viewer::tui::{self, LiveSource, RunOptions, ViewOptions};

/// Arguments of `vramtrace live`.
#[derive(clap::Args, Debug)]
#[command(
    after_help = "Examples:\n  vramtrace live trace-dir                 # a running job's directory, or a finished one\n  vramtrace live trace-dir --capacity 24GiB\n  vramtrace run --live -- python3 serve.py # record and watch in one terminal\n\nEvery *.vtr file of the directory is followed, new ones as they appear (workers, ranks).\nKeys: ? for help, q to quit."
)]
pub struct LiveArgs {
    /// The trace directory (it may still be empty: the view waits for files). With --attach:
    /// where to record (default: a new directory).
    #[arg(required_unless_present = "attach")]
    pub dir: Option<PathBuf>,
    /// Attach to this running CUDA program, show its allocations live, detach on quit
    /// (`vramtrace attach`).
    #[arg(long, value_name = "PID")]
    pub attach: Option<i32>,
    /// Draw a capacity line at this many bytes, e.g. `24GiB`.
    #[arg(long, value_name = "BYTES", value_parser = parse_bytes)]
    pub capacity: Option<u64>,
    /// How many of the largest live allocations to list.
    #[arg(long, default_value_t = 40)]
    pub top: usize,
    /// Do not ask NVML for device memory.
    #[arg(long)]
    pub no_nvml: bool,
    /// The model's config.json: the view shows the whole-step model beside the observed bytes
    /// and its tensors beside the live ones with what each match rests on (the `t` key), and a
    /// forecast line: the next chunk's modelled peak at the current context against the limit,
    /// and how many more tokens of context fit.
    #[arg(long, value_name = "CONFIG")]
    pub model: Option<PathBuf>,
    /// The program that runs the model: transformers, vllm-0.20.1, workload or
    /// torch-prefill-script.
    #[arg(long, default_value = "transformers", requires = "model")]
    pub runtime: String,
    /// Prefill chunk in tokens (vLLM's --max-num-batched-tokens).
    #[arg(long, default_value_t = 4128, requires = "model")]
    pub chunk: u64,
    /// KV cache block size in tokens.
    #[arg(long, default_value_t = 1, requires = "model")]
    pub kv_block_size: u64,
}

/// The live model of `--model` and its serving shape.
fn live_model(args: &LiveArgs) -> anyhow::Result<Option<vramtrace::forecast::LiveModel>> {
    let Some(path) = &args.model else {
        return Ok(None);
    };
    let cfg = vramtrace_models::ModelConfig::from_path(path)
        .with_context(|| format!("cannot read the model config {}", path.display()))?;
    let Some(runtime) = vramtrace_models::Runtime::from_name(&args.runtime) else {
        bail!(
            "--runtime {} is not one the models know; give transformers, vllm-0.20.1, workload or torch-prefill-script",
            args.runtime
        );
    };
    Ok(Some(vramtrace::forecast::LiveModel::new(
        cfg,
        runtime,
        args.chunk,
        args.kv_block_size,
        args.capacity,
    )?))
}

/// Runs `vramtrace live`.
pub fn run(args: LiveArgs) -> anyhow::Result<i32> {
    let options = LiveOptions {
        top: args.top,
        nvml: !args.no_nvml,
        ..LiveOptions::default()
    };
    if let Some(pid) = args.attach {
        return super::attach::live(pid, args.dir.as_deref(), options, args.capacity);
    }
    let model = live_model(&args)?;
    let dir = args.dir.clone().unwrap_or_default();
    if !std::io::stdout().is_terminal() || !std::io::stdin().is_terminal() {
        bail!(
            "vramtrace live draws in a terminal; stdin and stdout must be one. For text, use `vramtrace summary {}`",
            dir.display()
        );
    }
    let mut source = DirSource::new(&dir, options);
    if let Some(m) = model {
        source = source.with_model(m);
    }
    // NVML is opened only when asked for.
    let mut source = if args.no_nvml {
        source
    } else {
        source.with_device_memory(crate::nvml::open())
    };
    view(&mut source, &dir, args.capacity)?;
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

/// The log file of `vramtrace run --live`, in the trace directory.
pub const LOG_FILE: &str = "command.log";

/// Whether `vramtrace run --live` can show its view here; says why not when it cannot (the
/// caller then runs the command the ordinary way).
pub fn terminal_ok() -> bool {
    let ok = std::io::stdout().is_terminal() && std::io::stdin().is_terminal();
    if !ok {
        eprintln!("vramtrace: --live needs a terminal; running without the live view");
    }
    ok
}

/// `vramtrace run --live`: starts `cmd` (set up by `vramtrace run` to record into `dir`) with
/// its stdin empty and its output in [`LOG_FILE`] in `dir`, and shows the live view of `dir` in
/// this terminal. The view stays after the command exits until the user quits; quitting while
/// it still runs waits for it (Ctrl-C then reaches it). Returns the command's exit status.
pub fn run_with_view(
    mut cmd: std::process::Command,
    program: &OsStr,
    dir: &Path,
    capacity: Option<u64>,
) -> anyhow::Result<ExitStatus> {
    let log = dir.join(LOG_FILE);
    let out = std::fs::File::create(&log)
        .with_context(|| format!("cannot create the log file {}", log.display()))?;
    let err = out
        .try_clone()
        .with_context(|| format!("cannot reopen {}", log.display()))?;
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn()
        .with_context(|| format!("cannot start {}", program.to_string_lossy()))?;
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
        inner: DirSource::new(dir, LiveOptions::default()).with_device_memory(crate::nvml::open()),
        status: status.clone(),
        said: false,
        command: program.to_string_lossy().into_owned(),
        log: log.clone(),
    };
    let shown = view(&mut source, dir, capacity);
    if status.lock().unwrap_or_else(|e| e.into_inner()).is_none() {
        eprintln!(
            "vramtrace: waiting for {} to exit (Ctrl-C interrupts it)",
            program.to_string_lossy()
        );
    }
    let _guard = launch::IgnoreInterrupts::start();
    let st = waiter
        .join()
        .map_err(|_| anyhow::anyhow!("the thread waiting for the command panicked"))?
        .with_context(|| format!("waiting for {}", program.to_string_lossy()))?;
    shown?;
    eprintln!("vramtrace: the command's output is in {}", log.display());
    Ok(st)
}
