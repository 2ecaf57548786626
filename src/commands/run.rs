//! `vramtrace run`: runs a program with the preload, waits, prints a per-process summary and
//! exits with the program's exit code.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};

use crate::preload;
use crate::summary::{SummaryOptions, render, summarize};
use crate::trace::Trace;

/// Arguments of `vramtrace run`.
#[derive(clap::Args, Debug)]
#[command(
    after_help = "Examples:\n  vramtrace run -- python3 serve.py --model Qwen/Qwen3.6-27B\n  vramtrace run --out oom-trace -- ./llama-server -m model.gguf\n\nEvery process the program starts (workers, forks, exec'd children) is recorded into the same\ndirectory, one file per process. Read it with `vramtrace summary DIR` or `vramtrace events DIR`."
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
    /// Do not print the summary when the program exits.
    #[arg(long, short)]
    pub quiet: bool,
    /// The program and its arguments.
    #[arg(last = true, required = true, value_name = "CMD")]
    pub command: Vec<OsString>,
}

/// Runs `vramtrace run`.
pub fn run(args: RunArgs) -> anyhow::Result<i32> {
    let preload = preload::locate(args.preload.as_deref())?;
    let out = match &args.out {
        Some(dir) => prepare_out_dir(dir)?,
        None => new_out_dir(&args.command[0])?,
    };
    let opts = preload::Options {
        stacks: !args.no_stacks,
    };
    let status = preload::run_traced(&preload, &out, &args.command, &[], opts)?;
    let code = report_exit(&args.command[0], status);
    if !args.quiet {
        eprintln!("vramtrace: trace written to {}", out.display());
        match Trace::open(&out) {
            Ok(trace) => eprint!(
                "{}",
                render(&summarize(&trace, SummaryOptions::default()), false)
            ),
            Err(e) => eprintln!("vramtrace: {e:#}"),
        }
    }
    Ok(code)
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

/// Uses `dir` as the trace directory: created if absent, refused if it holds anything.
pub fn prepare_out_dir(dir: &Path) -> anyhow::Result<PathBuf> {
    if dir.exists() {
        if !dir.is_dir() {
            bail!("{} exists and is not a directory", dir.display());
        }
        let mut entries =
            std::fs::read_dir(dir).with_context(|| format!("cannot read {}", dir.display()))?;
        if entries.next().is_some() {
            bail!(
                "{} is not empty; vramtrace never overwrites a trace. Choose another --out or remove it.",
                dir.display()
            );
        }
    } else {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    std::path::absolute(dir).with_context(|| format!("cannot resolve {}", dir.display()))
}

/// Creates a fresh directory named after the program and the time; never reuses one.
pub fn new_out_dir(cmd: &std::ffi::OsStr) -> anyhow::Result<PathBuf> {
    let prog: String = Path::new(cmd)
        .file_name()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "program".into())
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.' {
                c
            } else {
                '_'
            }
        })
        .collect();
    let stamp = utc_stamp(std::time::SystemTime::now());
    for n in 0..1000 {
        let name = if n == 0 {
            format!("vramtrace-{prog}-{stamp}")
        } else {
            format!("vramtrace-{prog}-{stamp}-{n}")
        };
        let p = PathBuf::from(&name);
        match std::fs::create_dir(&p) {
            Ok(()) => {
                return std::path::absolute(&p).with_context(|| format!("cannot resolve {name}"));
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => {
                return Err(e)
                    .with_context(|| format!("cannot create {name} in the current directory"));
            }
        }
    }
    bail!("could not find a free directory name for the trace; pass --out")
}

/// `YYYYmmdd-HHMMSS` in UTC.
fn utc_stamp(t: std::time::SystemTime) -> String {
    let secs = t
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0) as i64;
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}{m:02}{d:02}-{:02}{:02}{:02}",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utc_stamps() {
        let t = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_795_941_234);
        assert_eq!(utc_stamp(t), "20261129-083354");
        assert_eq!(utc_stamp(std::time::UNIX_EPOCH), "19700101-000000");
    }
}
