//! `vramtrace attach PID`: record in a running CUDA program until Ctrl-C or `--duration`, then
//! detach, leaving it as it was (the `vramtrace-attach` crate does both).

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, bail};
use clap::Args;

use crate::launch;
use vramtrace_attach::{AttachOptions, PythonDetach, attach, detach};

/// `vramtrace attach` arguments.
#[derive(Args, Debug)]
#[command(
    after_help = "Examples:\n  vramtrace attach 4242 --duration 60s\n  vramtrace attach $(pgrep -f 'transformers serve') --out serve-trace\n\nThe process is stopped briefly (the pause is printed), the recorder is loaded into it and the\nCUDA driver's allocation entry points are hooked in place. Ctrl-C (or the duration) detaches:\nevery byte changed in the driver is put back and the process runs on as before. Needs the\nright to trace the process (same user, or root / CAP_SYS_PTRACE; see docs/deploy.md).\nx86-64 only."
)]
pub struct AttachArgs {
    /// The process id of the running CUDA program.
    pub pid: i32,
    /// Directory to write the trace into (created; an existing one must be empty). Default: a
    /// new directory `vramtrace-attach-<pid>-<UTC time>` in the current directory.
    #[arg(long, short)]
    pub out: Option<PathBuf>,
    /// Detach after this long (`30s`, `500ms`, `5m`); default: on Ctrl-C.
    #[arg(long, value_parser = parse_duration)]
    pub duration: Option<Duration>,
    /// The preload library. Default: `libvramtrace_preload.so` next to this binary.
    #[arg(long, env = "VRAMTRACE_PRELOAD", value_name = "PATH")]
    pub preload: Option<PathBuf>,
}

/// The file in the trace directory that says what the attach was (JSON).
pub const ATTACH_RECORD: &str = "attach.json";

/// `30s`, `500ms`, `5m`, `1h` or plain seconds (`2.5`).
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let (num, unit) = match s.find(|c: char| c.is_ascii_alphabetic()) {
        Some(i) => s.split_at(i),
        None => (s, "s"),
    };
    let v: f64 = num
        .trim()
        .parse()
        .map_err(|_| format!("{s:?} is not a duration; write 30s, 500ms, 5m or 1h"))?;
    let scale = match unit {
        "ms" => 1e-3,
        "s" => 1.0,
        "m" | "min" => 60.0,
        "h" => 3600.0,
        _ => {
            return Err(format!(
                "{s:?}: unknown unit {unit:?}; write 30s, 500ms, 5m or 1h"
            ));
        }
    };
    if !(v.is_finite() && v >= 0.0) {
        return Err(format!("{s:?} is not a duration of zero or more"));
    }
    Ok(Duration::from_secs_f64(v * scale))
}

/// The signals that end a recording; blocked for the whole command so that none lands in the
/// middle of attaching or detaching, and waited for between the two.
fn ending_signals() -> libc::sigset_t {
    // Safety: sigemptyset/sigaddset fill a set we own.
    unsafe {
        let mut set: libc::sigset_t = core::mem::zeroed();
        libc::sigemptyset(&mut set);
        for s in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
            libc::sigaddset(&mut set, s);
        }
        set
    }
}

/// Runs `f` with Ctrl-Z (and the background-terminal stops) held off: while `f` runs, the
/// target's threads may be stopped, and a suspended `vramtrace` would leave them so.
fn without_job_control<T>(f: impl FnOnce() -> T) -> T {
    // Safety: sigemptyset/sigaddset fill a set we own; pthread_sigmask with valid sets.
    unsafe {
        let mut set: libc::sigset_t = core::mem::zeroed();
        let mut old: libc::sigset_t = core::mem::zeroed();
        libc::sigemptyset(&mut set);
        for s in [libc::SIGTSTP, libc::SIGTTIN, libc::SIGTTOU] {
            libc::sigaddset(&mut set, s);
        }
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, &mut old);
        let r = f();
        libc::pthread_sigmask(libc::SIG_SETMASK, &old, core::ptr::null_mut());
        r
    }
}

/// Waits for `duration` (forever if `None`), one of the ending signals, or the end of process
/// `pid`.
fn wait_for_end(set: &libc::sigset_t, duration: Option<Duration>, pid: i32) {
    let start = std::time::Instant::now();
    let alive = || {
        std::fs::read_to_string(format!("/proc/{pid}/status")).is_ok_and(|s| {
            !s.lines()
                .any(|l| l.starts_with("State:") && l.contains('Z'))
        })
    };
    loop {
        if !alive() {
            return;
        }
        let left = match duration {
            Some(d) => match d.checked_sub(start.elapsed()) {
                Some(l) if !l.is_zero() => l,
                _ => return,
            },
            None => Duration::from_secs(3600),
        }
        .min(Duration::from_millis(200));
        let ts = libc::timespec {
            tv_sec: left.as_secs() as libc::time_t,
            tv_nsec: left.subsec_nanos() as libc::c_long,
        };
        // Safety: a valid set and timespec; no siginfo wanted.
        let r = unsafe { libc::sigtimedwait(set, core::ptr::null_mut(), &ts) };
        if r > 0 {
            return;
        }
    }
}

/// Runs `vramtrace attach`.
pub fn run(args: AttachArgs) -> anyhow::Result<i32> {
    let set = ending_signals();
    // Safety: blocks signals for this thread (the only one) with a valid set.
    unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, core::ptr::null_mut()) };
    let (attached, out, nvml) = start(args.pid, args.out.as_deref(), args.preload.as_deref())?;
    eprintln!(
        "vramtrace: recording into {}{}",
        out.display(),
        match args.duration {
            Some(d) => format!(" for {:.1} s.", d.as_secs_f64()),
            None => "; Ctrl-C detaches.".into(),
        }
    );
    wait_for_end(&set, args.duration, args.pid);
    finish(attached, &out, nvml)?;
    eprintln!(
        "vramtrace: read the trace with `vramtrace summary {}`",
        out.display()
    );
    Ok(0)
}

/// Attaches to `pid`, recording into `out` (a new directory by default); says so on stderr.
/// Refusals that need no directory come first: nothing is created for them. Also returns
/// NVML's view of the process just before (`nvml_at_attach`).
fn start(
    pid: i32,
    out: Option<&Path>,
    preload: Option<&Path>,
) -> anyhow::Result<(vramtrace_attach::Attached, PathBuf, serde_json::Value)> {
    let preload = launch::locate(preload)?;
    let facts = vramtrace_attach::target_facts(pid)?;
    vramtrace_attach::may_attach(pid, &facts, &vramtrace_attach::self_facts(pid))?;
    let out = match out {
        Some(dir) => crate::trace_dir::prepare_out_dir(dir)?,
        None => crate::trace_dir::new_out_dir(std::ffi::OsStr::new(&format!("attach-{pid}")))?,
    };
    let out =
        std::path::absolute(&out).with_context(|| format!("cannot resolve {}", out.display()))?;
    let nvml = nvml_at_attach(pid);
    let python_probe = crate::launch::torch_probe_dir(&preload)
        .and_then(|autostart| autostart.parent().map(Path::to_path_buf))
        .filter(|dir| dir.join(vramtrace::torch_replay::PROBE_FILE).is_file());
    let attached = match without_job_control(|| {
        attach(&AttachOptions {
            pid,
            out: out.clone(),
            preload,
            python_probe,
        })
    }) {
        Ok(a) => a,
        Err(e) => {
            // Nothing was recorded: leave no empty directory behind.
            let _ = std::fs::remove_dir(&out);
            return Err(e.into());
        }
    };
    eprintln!(
        "vramtrace: attached to process {} ({} entry points hooked{}{}); it was stopped {:.1} ms (all {} threads together {:.1} ms)",
        attached.pid,
        attached.hooks.len(),
        if attached.python {
            ", the Python probe scheduled"
        } else {
            ""
        },
        if attached.watchdog {
            ", a watchdog restores it if vramtrace dies"
        } else {
            ""
        },
        attached.call_pause.as_secs_f64() * 1e3,
        attached.threads,
        attached.all_pause.as_secs_f64() * 1e3,
    );
    for why in &attached.left_alone {
        eprintln!(
            "vramtrace: {why}: left alone, so PyTorch's blocks are recorded through its allocator callbacks, not natively"
        );
    }
    Ok((attached, out, nvml))
}

/// NVML's view of `pid` at the attach, per device (PCI order): the device's used and total
/// memory and this process's share, or why there is none.
fn nvml_at_attach(pid: i32) -> serde_json::Value {
    use nvml_wrapper::enums::device::UsedGpuMemory;
    let nvml = match nvml_wrapper::Nvml::init() {
        Ok(n) => n,
        Err(nvml_wrapper::error::NvmlError::LibloadingError(_)) => {
            return serde_json::json!({"unavailable": "libnvidia-ml.so.1 cannot be loaded (no NVIDIA driver here)"});
        }
        Err(e) => return serde_json::json!({"unavailable": e.to_string()}),
    };
    let read = || -> Result<Vec<serde_json::Value>, nvml_wrapper::error::NvmlError> {
        let mut devices = Vec::new();
        for i in 0..nvml.device_count()? {
            let d = nvml.device_by_index(i)?;
            let m = d.memory_info()?;
            let mine = d
                .running_compute_processes()?
                .into_iter()
                .filter(|p| p.pid == pid as u32)
                .map(|p| match p.used_gpu_memory {
                    UsedGpuMemory::Used(b) => b,
                    UsedGpuMemory::Unavailable => 0,
                })
                .sum::<u64>();
            devices.push(serde_json::json!({
                "nvml_index": i,
                "name": d.name().unwrap_or_default(),
                "used_bytes": m.used,
                "total_bytes": m.total,
                "process_bytes": mine,
            }));
        }
        Ok(devices)
    };
    match read() {
        Ok(devices) => serde_json::json!({ "devices": devices }),
        Err(e) => serde_json::json!({"unavailable": e.to_string()}),
    }
}

/// Detaches and says how it went.
fn finish(
    attached: vramtrace_attach::Attached,
    out: &Path,
    nvml: serde_json::Value,
) -> anyhow::Result<()> {
    let pid = attached.pid;
    let mut record = serde_json::json!({
        "nvml_at_attach": nvml,
        "pid": pid,
        "attached_at_ns": attached.attached_at_ns,
        "main_thread_paused_ms": attached.call_pause.as_secs_f64() * 1e3,
        "all_threads_paused_ms": attached.all_pause.as_secs_f64() * 1e3,
        "threads": attached.threads,
        "hooked": attached.hooks.iter().map(|h| h.name.as_str()).collect::<Vec<_>>(),
        "python_probe": attached.python,
        "left_alone": attached.left_alone.iter().map(ToString::to_string).collect::<Vec<_>>(),
        "watchdog": attached.watchdog,
    });
    let d = without_job_control(|| detach(attached));
    record["detached_at_ns"] = serde_json::json!(vramtrace_attach::monotonic_ns());
    if let Ok(d) = &d {
        record["detach_paused_ms"] = serde_json::json!(d.pause.as_secs_f64() * 1e3);
        record["exited_while_attached"] = serde_json::json!(d.exited);
        record["children"] = serde_json::json!(d.children.iter().map(|c| c.0).collect::<Vec<_>>());
        record["python_probe_at_detach"] = python_detach_record(d.python);
    }
    // What the attach was, beside the trace files (readers follow only *.vtr): the times are
    // the trace's clock, so anything before `attached_at_ns` is not in the trace unless marked
    // `before attach`.
    let _ = std::fs::write(
        out.join(ATTACH_RECORD),
        serde_json::to_vec_pretty(&record).unwrap_or_default(),
    );
    let d = d.with_context(|| format!("the trace so far is in {}", out.display()))?;
    for (child, result) in &d.children {
        match result {
            Ok(()) => eprintln!(
                "vramtrace: detached from process {child} too (forked while attached; its trace is its own file)"
            ),
            Err(e) => eprintln!(
                "vramtrace: process {child}, forked while attached, could not be detached: {e}"
            ),
        }
    }
    if d.exited {
        eprintln!(
            "vramtrace: process {pid} exited while attached; its trace is complete up to its exit"
        );
        return Ok(());
    }
    eprintln!(
        "vramtrace: detached from process {pid}; it was stopped {:.1} ms. Every hooked byte is restored.",
        d.pause.as_secs_f64() * 1e3
    );
    if let Some(line) = python_detach_line(d.python) {
        eprintln!("vramtrace: {line}");
    }
    if !d.changed_by_others.is_empty() {
        bail!(
            "entry points changed by something else while attached were left as found: {}",
            d.changed_by_others.join(", ")
        );
    }
    Ok(())
}

/// `vramtrace live --attach PID`: attaches, shows the live view of the new trace until the
/// user quits, then detaches.
pub fn live(
    pid: i32,
    out: Option<&Path>,
    options: vramtrace::live::LiveOptions,
    capacity: Option<u64>,
) -> anyhow::Result<i32> {
    use std::io::IsTerminal;
    if !std::io::stdout().is_terminal() || !std::io::stdin().is_terminal() {
        bail!(
            "vramtrace live draws in a terminal; stdin and stdout must be one. Without one, use `vramtrace attach {pid}`"
        );
    }
    let set = ending_signals();
    // Safety: blocks signals for this thread (the only one yet) with a valid set.
    unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, core::ptr::null_mut()) };
    let (attached, out, nvml) = start(pid, out, None)?;
    let ask_nvml = options.nvml;
    let source = vramtrace::live::DirSource::new(&out, options);
    // NVML is opened only when asked for.
    let mut source = if ask_nvml {
        source.with_device_memory(crate::nvml::open())
    } else {
        source
    };
    let view = vramtrace_viewer::tui::run(
        &mut source,
        &vramtrace_viewer::tui::RunOptions {
            view: vramtrace_viewer::tui::ViewOptions {
                title: format!("process {pid} (attached) → {}", out.display()),
                capacity_bytes: capacity,
                ..vramtrace_viewer::tui::ViewOptions::default()
            },
            tick: Duration::from_millis(100),
        },
    );
    // Detach whatever happened to the view.
    finish(attached, &out, nvml)?;
    view.context("the live view failed")?;
    Ok(0)
}

/// What `attach.json` says of the Python probe at detach.
fn python_detach_record(p: PythonDetach) -> serde_json::Value {
    match p {
        PythonDetach::NotStarted => serde_json::json!({"state": "not started"}),
        PythonDetach::Done {
            after,
            gpu_trace_stays,
            native_off,
            error,
            removed,
        } => serde_json::json!({
            "state": "deactivated",
            "callbacks_removed": removed,
            "after_ms": after.as_secs_f64() * 1e3,
            "gpu_trace_stays_on": gpu_trace_stays,
            "native_capture_turned_off": native_off,
            "something_left": error,
        }),
        PythonDetach::NotInTime { waited } => serde_json::json!({
            "state": "not run in time",
            "waited_ms": waited.as_secs_f64() * 1e3,
        }),
    }
}

/// The line `attach` prints about the Python probe at detach, if it had one.
fn python_detach_line(p: PythonDetach) -> Option<String> {
    match p {
        PythonDetach::NotStarted => None,
        PythonDetach::Done {
            after,
            gpu_trace_stays,
            native_off,
            error,
            removed,
        } => {
            let mut line = format!(
                "the Python probe is off ({:.1} ms after the process went on){}",
                after.as_secs_f64() * 1e3,
                if removed {
                    ": its allocator callbacks are removed"
                } else {
                    ""
                }
            );
            if native_off {
                line.push_str(", native tensor capture is off");
            }
            if gpu_trace_stays {
                line.push_str(
                    "; PyTorch's gpu-trace hook, once on, cannot be turned off, so each block it \
                     hands out still costs it a call into an empty Python callback list",
                );
            }
            if error {
                line.push_str("; something could not be undone: the process's stderr says what");
            }
            Some(line)
        }
        PythonDetach::NotInTime { waited } => Some(format!(
            "the Python probe did not deactivate within {:.1} s: the interpreter's main thread \
             did not reach its eval loop (blocked in a call, or busy in C code). Its deactivation \
             stays scheduled and runs when it does; until then its callbacks stay registered and \
             cost the program a Python call per block, recording nothing (raise \
             VRAMTRACE_DETACH_PYTHON_WAIT_MS to wait longer)",
            waited.as_secs_f64()
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse() {
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(parse_duration("2.5"), Ok(Duration::from_millis(2500)));
        assert!(parse_duration("soon").is_err());
        assert!(parse_duration("3 weeks").is_err());
    }
}
