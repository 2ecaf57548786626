//! `vramtrace attach`: recording in a CUDA program that is already running, and `detach`,
//! which puts back every byte it changed. Design: docs/architecture.md, "Attaching to a
//! running process"; permissions: docs/deploy.md.
//!
//! In short: stop one thread of the target, call `dlopen` in it to load the preload (which
//! knows it arrived late: `probes/preload/src/attach.rs`), map one page of trampolines near
//! the driver and tell the preload where they are, turn recording on; then stop every thread,
//! make sure none is inside the bytes about to change, write a 5-byte jump at each of the
//! driver's allocation entry points, and let the process go. `detach` stops every thread,
//! writes the original bytes back, turns recording off and lets it go. Any step that fails
//! undoes the steps before it. x86-64 only: on any other architecture [`attach`] refuses.
//!
//! The `vramtrace` binary's `attach` and `live --attach` commands are its callers; it reads no
//! trace and depends on no other vramtrace crate. Everything that fails is an [`AttachError`]:
//! [`AttachError::Refused`] when nothing was touched (an [`Ineligible`] process, or something
//! attaching needs is missing), [`AttachError::Failed`] when a step failed and what was done
//! before it was undone ([`Undo`] says whether all of it), [`AttachError::DetachFailed`] at
//! detach; each wraps the cause (a ptrace request and its errno, an ELF symbol, a hook that
//! cannot be built, a call into the target that timed out, ...).

// The injection itself is x86-64 code (registers, trampolines); elsewhere `attach` refuses and
// the rest is unused.
#![cfg_attr(not(target_arch = "x86_64"), allow(dead_code, unused_imports))]

mod elf;
mod error;
#[cfg(target_arch = "x86_64")]
mod journal;
mod patch;
#[cfg(target_arch = "x86_64")]
mod ptrace;
mod target;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

pub use error::{AttachError, Ineligible, StartRefusal, TrampolineError, Undo};
pub use target::{
    Mapping, SelfFacts, TargetFacts, may_attach, parse_maps, parse_status, self_facts, target_facts,
};

use elf::Symbols;
#[cfg(target_arch = "x86_64")]
use journal::{Journal, Watched};
#[cfg(target_arch = "x86_64")]
use ptrace::{LANDING, SavedRegs, Tracer};

/// `c10::reportMemoryUsageToProfiler(void*, int64_t, size_t, size_t, c10::Device)` in
/// libc10.so: the caching allocator reports each block's size to it, and native tensor capture
/// reads that report (the preload's `torch_tracker.rs`).
pub const C10_REPORT: &str = "_ZN3c1027reportMemoryUsageToProfilerEPvlmmNS_6DeviceE";

/// What to attach to and where to record.
#[derive(Clone, Debug)]
pub struct AttachOptions {
    /// The process.
    pub pid: i32,
    /// The trace directory (absolute; made by the caller).
    pub out: PathBuf,
    /// The preload library (absolute).
    pub preload: PathBuf,
    /// The directory holding the Python probe (`vramtrace_torch.py`), to start it in a Python
    /// target; `None`: no Python probe.
    pub python_probe: Option<PathBuf>,
}

/// One hooked entry point.
#[derive(Clone, Debug)]
pub struct Hook {
    /// The driver function.
    pub name: String,
    /// Its address in the target.
    pub entry: u64,
    /// The bytes the jump replaced.
    pub original: [u8; patch::JUMP_LEN],
    /// The jump.
    pub jump: [u8; patch::JUMP_LEN],
}

/// A process with vramtrace attached.
pub struct Attached {
    /// The process.
    pub pid: i32,
    /// The hooked entry points.
    pub hooks: Vec<Hook>,
    /// `vramtrace_attach_stop` in the target.
    #[cfg(target_arch = "x86_64")]
    stop_fn: u64,
    /// Where calls into the target return.
    #[cfg(target_arch = "x86_64")]
    landing: u64,
    /// The journal and its watchdog.
    #[cfg(target_arch = "x86_64")]
    watched: Watched,
    /// Whether a watchdog process restores the target if `vramtrace` dies.
    pub watchdog: bool,
    /// Whether the Python probe was scheduled to start in the target's interpreter.
    pub python: bool,
    /// `vramtrace_attach_python` and `vramtrace_attach_python_detached` in the target, to
    /// deactivate the Python probe at detach.
    #[cfg(target_arch = "x86_64")]
    python_at: (u64, u64),
    /// Optional entry points not hooked, and why (PyTorch's `reportMemoryUsageToProfiler` out
    /// of reach of the trampoline page: native tensor capture then fails its check): each an
    /// [`AttachError::Hook`].
    pub left_alone: Vec<AttachError>,
    /// How long the thread that loaded the preload was stopped.
    pub call_pause: Duration,
    /// How long every thread was stopped while the jumps were written.
    pub all_pause: Duration,
    /// How many threads were stopped.
    pub threads: usize,
    /// When the hooks were in, on the trace's clock (`CLOCK_MONOTONIC`, nanoseconds).
    pub attached_at_ns: u64,
}

/// `CLOCK_MONOTONIC` in nanoseconds: the clock of the trace's timestamps.
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // Safety: a valid timespec to fill.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// What [`detach`] did.
#[derive(Debug)]
pub struct Detached {
    /// How long the process was stopped.
    pub pause: Duration,
    /// Entry points whose bytes were not our jump any more, left as found.
    pub changed_by_others: Vec<String>,
    /// The process had exited: nothing to restore, its trace ends with it.
    pub exited: bool,
    /// Children forked while attached (they inherited the hooks and recorded into files of
    /// their own), each detached in turn, or why not.
    pub children: Vec<(i32, Result<(), AttachError>)>,
    /// What became of the Python probe.
    pub python: PythonDetach,
}

/// What became of the Python probe at detach: its `detach()` is scheduled in the interpreter
/// like its `attach()` was, and reports back through the preload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PythonDetach {
    /// No Python probe was started (not a Python process, or the process exited).
    NotStarted,
    /// It ran: the probe's callbacks are gone.
    Done {
        /// How long after the process was let go it reported.
        after: Duration,
        /// PyTorch's gpu-trace hook stays on (it cannot be turned off): each block still costs
        /// PyTorch a call into an empty Python callback list.
        gpu_trace_stays: bool,
        /// Native capture was on and is off now.
        native_off: bool,
        /// Something could not be undone (the probe said what on the process's stderr).
        error: bool,
        /// Its allocator callbacks were registered and are removed now (else it had none:
        /// no PyTorch, or native capture).
        removed: bool,
    },
    /// It did not run within the wait (the interpreter's main thread did not reach its eval
    /// loop: blocked in a call, or busy in C code). It stays scheduled and runs when it does;
    /// until then the probe's callbacks stay registered (they record nothing: recording is off).
    NotInTime {
        /// How long vramtrace waited.
        waited: Duration,
    },
}

/// How long `detach` waits for the Python probe's `detach()` to run in the interpreter:
/// `VRAMTRACE_DETACH_PYTHON_WAIT_MS`, else 5 s.
pub fn python_detach_wait() -> Duration {
    std::env::var("VRAMTRACE_DETACH_PYTHON_WAIT_MS")
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map_or(Duration::from_secs(5), Duration::from_millis)
}

#[cfg(target_arch = "x86_64")]
#[cfg(target_arch = "x86_64")]
#[cfg(target_arch = "x86_64")]
#[cfg(target_arch = "x86_64")]
/// `dlopen` flags.
const RTLD_NOW: u64 = 2;
/// Bytes of the trampoline page.
const PAGE: u64 = 4096;
/// How long one call into the target may take (`dlopen` of the preload included).
const CALL_LIMIT: Duration = Duration::from_secs(20);
/// Single steps allowed to move a thread out of bytes about to change.
const STEP_LIMIT: usize = 64;

/// The target's files, read as it sees them (its mount namespace).
fn in_target(pid: i32, path: &Path) -> PathBuf {
    let rel = path.strip_prefix("/").unwrap_or(path);
    Path::new(&format!("/proc/{pid}/root")).join(rel)
}

fn maps_of(pid: i32) -> Result<Vec<Mapping>, AttachError> {
    std::fs::read_to_string(format!("/proc/{pid}/maps"))
        .map(|t| parse_maps(&t))
        .map_err(|error| AttachError::MemoryMap { pid, error })
}

fn cstr(s: &str) -> Vec<u8> {
    let mut v = s.as_bytes().to_vec();
    v.push(0);
    v
}

/// The recorder's attach state and attacher in process `pid`, which has it loaded from `path`
/// at `base` (`probes/preload/src/attach.rs`: 0 never, 1 attached, 2 detached).
fn attach_state(pid: i32, path: &Path, base: u64) -> Option<(u32, u32)> {
    let s = Symbols::read(&in_target(pid, path), base).ok()?;
    let read = |a: u64| -> Option<u32> {
        use std::os::unix::fs::FileExt;
        let mut b = [0u8; 4];
        std::fs::File::open(format!("/proc/{pid}/mem"))
            .ok()?
            .read_exact_at(&mut b, a)
            .ok()?;
        Some(u32::from_le_bytes(b))
    };
    Some((
        read(s.get("vramtrace_attach_state")?)?,
        read(s.get("vramtrace_attach_pid")?)?,
    ))
}

/// Says why a process that has the recorder loaded already must not be attached again.
fn already_there(pid: i32, path: &Path, base: u64) -> Ineligible {
    match attach_state(pid, path, base) {
        Some((1, by)) => Ineligible::AlreadyAttached { by },
        Some((2, _)) => Ineligible::AttachedBefore,
        _ => Ineligible::UnderRun {
            recorder: path.to_path_buf(),
        },
    }
}

/// Attaches: after this returns, every allocation the process makes through the driver's
/// hooked entry points is recorded into `opts.out`, until [`detach`].
#[cfg(not(target_arch = "x86_64"))]
pub fn attach(opts: &AttachOptions) -> Result<Attached, AttachError> {
    Err(not_here(opts.pid))
}

/// The refusal on an architecture `attach` does not support.
#[cfg(not(target_arch = "x86_64"))]
fn not_here(pid: i32) -> AttachError {
    AttachError::refused(
        pid,
        Ineligible::Unsupported {
            arch: std::env::consts::ARCH,
        },
    )
}

/// Attaches: after this returns, every allocation the process makes through the driver's
/// hooked entry points is recorded into `opts.out`, until [`detach`].
#[cfg(target_arch = "x86_64")]
pub fn attach(opts: &AttachOptions) -> Result<Attached, AttachError> {
    let pid = opts.pid;
    if pid <= 0 || pid as u32 == std::process::id() {
        return Err(AttachError::refused(pid, Ineligible::NotAProcess));
    }
    let facts = target::target_facts(pid)?;
    let me = target::self_facts(pid);
    may_attach(pid, &facts, &me)?;
    let refuse = |cause: AttachError| AttachError::refused(pid, cause);
    let maps = maps_of(pid).map_err(refuse)?;
    if let Some((path, base)) = target::find_object(&maps, "libvramtrace_preload") {
        return Err(refuse(already_there(pid, &path, base).into()));
    }
    let (cuda_path, cuda_base) = target::find_object(&maps, "libcuda.so")
        .ok_or_else(|| refuse(Ineligible::NoDriver.into()))?;
    let (libc_path, libc_base) = target::find_object(&maps, "libc.so.6")
        .ok_or_else(|| refuse(Ineligible::NoGlibc.into()))?;
    let libc = Symbols::read(&in_target(pid, &libc_path), libc_base).map_err(refuse)?;
    let missing = |symbol: &'static str| {
        refuse(AttachError::MissingSymbol {
            object: libc_path.clone(),
            symbol,
        })
    };
    let dlopen = libc
        .get("dlopen")
        .or_else(|| libc.get("__libc_dlopen_mode"))
        .ok_or_else(|| missing("dlopen"))?;
    let need = |symbol: &'static str| libc.get(symbol).ok_or_else(|| missing(symbol));
    let (dlerror, mmap, munmap) = (need("dlerror")?, need("mmap")?, need("munmap")?);
    let cuda = Symbols::read(&in_target(pid, &cuda_path), cuda_base).map_err(refuse)?;
    // The entry points to hook: every wrapper the preload exports that the driver has too.
    let wrappers = Symbols::read(&opts.preload, 0).map_err(refuse)?;
    let mut names: Vec<String> = wrappers
        .names()
        .filter(|n| n.starts_with("cu") && !n.starts_with("cuGetProcAddress"))
        .filter(|n| cuda.get(n).is_some())
        .map(str::to_string)
        .collect();
    names.sort();
    if names.is_empty() {
        return Err(refuse(
            Ineligible::NoEntryPoints {
                driver: cuda_path.clone(),
            }
            .into(),
        ));
    }
    let (lo, hi) = target::object_range(&maps, &cuda_path).unwrap_or((cuda_base, cuda_base));
    // PyTorch's report of each block to its profiler, hooked like the driver's entry points when
    // libc10.so is loaded (under LD_PRELOAD the preload interposes it): native tensor capture
    // needs it. Optional: out of reach, it is left alone and the probe uses its callbacks.
    let mut entries: Vec<(String, u64, bool)> = names
        .iter()
        .map(|n| (n.clone(), cuda.get(n).unwrap_or_default(), false))
        .collect();
    let mut near = Vec::new();
    if let Some((c10_path, c10_base)) = target::find_object(&maps, "libc10.so")
        && let Ok(c10) = Symbols::read(&in_target(pid, &c10_path), c10_base)
        && let Some(at) = c10.get(C10_REPORT)
        && wrappers.get(C10_REPORT).is_some()
    {
        entries.push((C10_REPORT.to_string(), at, true));
        // A page within reach of both, if there is one; else of the driver only.
        near.push((lo.min(at), hi.max(at + 1)));
    }
    near.push((lo, hi));

    let mut tracer = Tracer::new(pid).map_err(refuse)?;
    let mut watched = Watched::start(pid).map_err(refuse)?;
    let watchdog = watched.has_watchdog();
    let j = watched.journal();
    j.phase
        .store(journal::CHANGING, std::sync::atomic::Ordering::SeqCst);
    let started = Instant::now();
    // The thread the calls run on: the main one, or any other if it has exited.
    let mut caller = None;
    for tid in std::iter::once(pid).chain(task_ids(pid)) {
        match tracer.stop(tid) {
            Ok(true) => {
                caller = Some(tid);
                break;
            }
            Ok(false) => continue,
            Err(e) => {
                j.phase
                    .store(journal::IDLE, std::sync::atomic::Ordering::SeqCst);
                return Err(refuse(e));
            }
        }
    }
    let Some(caller) = caller else {
        j.phase
            .store(journal::IDLE, std::sync::atomic::Ordering::SeqCst);
        return Err(refuse(AttachError::NoThreadStopped));
    };
    let saved = match tracer.save(caller) {
        Ok(s) => s,
        Err(cause) => {
            tracer.release_all();
            j.phase
                .store(journal::IDLE, std::sync::atomic::Ordering::SeqCst);
            return Err(AttachError::Failed {
                pid,
                step: "saving the registers",
                cause: Box::new(cause),
                undo: Undo::Nothing,
            });
        }
    };
    j.save_regs(caller, &saved);
    j.regs_changed = 1;
    let result = install(
        &mut tracer,
        caller,
        &saved,
        opts,
        &entries,
        &near,
        Libc {
            dlopen,
            dlerror,
            mmap,
            munmap,
        },
        j,
    );
    match result {
        Ok(Installed {
            hooks,
            stop_fn,
            all_pause,
            threads,
            python,
            python_at,
            left_alone,
        }) => {
            let restored = tracer.restore(caller, &saved);
            tracer.release_all();
            let landing = j.landing;
            j.regs_changed = 0;
            j.phase
                .store(journal::ATTACHED, std::sync::atomic::Ordering::SeqCst);
            restored.map_err(|cause| AttachError::Failed {
                pid,
                step: "restoring the registers",
                cause: Box::new(cause),
                undo: Undo::Nothing,
            })?;
            Ok(Attached {
                pid,
                hooks,
                stop_fn,
                landing,
                watched,
                watchdog,
                python,
                python_at,
                left_alone,
                call_pause: started.elapsed(),
                all_pause,
                threads,
                attached_at_ns: monotonic_ns(),
            })
        }
        Err((step, cause)) => {
            let mut left = roll_back(&mut tracer, caller, &saved, j);
            let restored = tracer.restore(caller, &saved);
            tracer.release_all();
            j.regs_changed = 0;
            j.phase
                .store(journal::IDLE, std::sync::atomic::Ordering::SeqCst);
            watched.finish();
            if let Err(e) = restored {
                left.push(e);
            }
            let undo = if left.is_empty() {
                Undo::Done
            } else {
                Undo::Left(left)
            };
            Err(AttachError::Failed {
                pid,
                step,
                cause: Box::new(cause),
                undo,
            })
        }
    }
}

#[cfg(target_arch = "x86_64")]
/// Stops here, for good, when `VRAMTRACE_ATTACH_TEST_KILL` names `point`: how the tests show
/// that the watchdog restores a target whose `vramtrace` was killed at that point.
fn kill_point(point: &str) {
    if std::env::var("VRAMTRACE_ATTACH_TEST_KILL").is_ok_and(|v| v == point) {
        // Safety: raising a signal at ourselves.
        unsafe { libc::raise(libc::SIGKILL) };
    }
}

#[cfg(target_arch = "x86_64")]
fn task_ids(pid: i32) -> Vec<i32> {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(|d| {
            d.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

#[cfg(target_arch = "x86_64")]
/// The glibc functions called in the target.
struct Libc {
    dlopen: u64,
    dlerror: u64,
    mmap: u64,
    munmap: u64,
}

#[cfg(target_arch = "x86_64")]
/// Undoes what the journal says was done, in reverse order; returns what could not be
/// undone.
fn roll_back(
    tracer: &mut Tracer,
    caller: i32,
    saved: &SavedRegs,
    j: &mut Journal,
) -> Vec<AttachError> {
    let mut left = Vec::new();
    for i in (0..j.n_hooks as usize).rev() {
        let (entry, original, jump) = (j.entry[i], j.original[i], j.jump[i]);
        let len = patch::JUMP_LEN;
        if tracer.read(entry, len).is_ok_and(|now| now == jump[..len])
            && let Err(e) = tracer.write(entry, &original[..len])
        {
            left.push(e);
        }
    }
    j.n_hooks = 0;
    if j.stop_fn != 0 {
        match tracer.call(
            caller,
            saved,
            j.stop_fn,
            &[],
            |_| vec![],
            j.landing,
            CALL_LIMIT,
        ) {
            Ok(_) => j.stop_fn = 0,
            Err(e) => left.push(AttachError::RecordingStaysOn { cause: Box::new(e) }),
        }
    }
    if j.page != 0 {
        // Returns to address 0: the landing is in the page going away.
        match tracer.call(
            caller,
            saved,
            j.munmap,
            &[],
            |_| vec![j.page, PAGE],
            0,
            CALL_LIMIT,
        ) {
            Ok(_) => j.page = 0,
            Err(e) => left.push(AttachError::PageStays {
                page: j.page,
                cause: Box::new(e),
            }),
        }
    }
    left
}

#[cfg(target_arch = "x86_64")]
/// A step's failure: the step and what went wrong.
type StepResult<T> = Result<T, (&'static str, AttachError)>;

#[cfg(target_arch = "x86_64")]
/// What [`install`] returns.
struct Installed {
    hooks: Vec<Hook>,
    /// `vramtrace_attach_stop` in the target.
    stop_fn: u64,
    /// How long every thread was stopped.
    all_pause: Duration,
    /// How many threads there were.
    threads: usize,
    /// Whether the Python probe was scheduled.
    python: bool,
    /// `vramtrace_attach_python` and `vramtrace_attach_python_detached` in the target.
    python_at: (u64, u64),
    /// Why optional entry points were left alone.
    left_alone: Vec<AttachError>,
}

#[cfg(target_arch = "x86_64")]
/// The Python run in the target's interpreter (`Py_AddPendingCall`): the probe's `attach`, in a
/// namespace of its own so that nothing is added to `__main__`; a failure is one line on
/// stderr, never an exception in the program.
fn python_starter(probe_dir: &Path, preload: &Path) -> String {
    let py = |p: &Path| format!("{:?}", p.to_string_lossy());
    let body = format!(
        "import sys\n\
         d = {dir}\n\
         sys.path.insert(0, d)\n\
         try:\n    \
             sys._vramtrace_preload = {lib}\n    \
             import vramtrace_torch\n    \
             vramtrace_torch.attach({lib})\n\
         except BaseException as e:\n    \
             sys.stderr.write('vramtrace: torch probe not started: %r\\n' % (e,))\n\
         finally:\n    \
             sys.path.remove(d)\n",
        dir = py(probe_dir),
        lib = py(preload),
    );
    format!("exec({body:?}, {{}})")
}

#[cfg(target_arch = "x86_64")]
/// The Python run in the target's interpreter at detach: the probe's `detach()` (it reports to
/// the preload itself); without the probe's module, the report that nothing was there.
fn python_stopper() -> String {
    let body = "import sys\n\
                m = sys.modules.get('vramtrace_torch')\n\
                try:\n    \
                    if m is None:\n        \
                        import ctypes\n        \
                        ctypes.PyDLL(sys._vramtrace_preload).vramtrace_attach_python_done(1)\n    \
                    else:\n        \
                        m.detach()\n\
                except BaseException as e:\n    \
                    sys.stderr.write('vramtrace: torch probe not deactivated: %r\\n' % (e,))\n    \
                    import ctypes\n    \
                    ctypes.PyDLL(sys._vramtrace_preload).vramtrace_attach_python_done(9)\n";
    format!("exec({body:?}, {{}})")
}

#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
fn install(
    tracer: &mut Tracer,
    caller: i32,
    saved: &SavedRegs,
    opts: &AttachOptions,
    entries: &[(String, u64, bool)],
    near: &[(u64, u64)],
    libc: Libc,
    j: &mut Journal,
) -> StepResult<Installed> {
    let pid = opts.pid;
    let path = opts.preload.to_string_lossy().into_owned();
    let call =
        |tracer: &mut Tracer, f: u64, data: &[u8], args: &dyn Fn(u64) -> Vec<u64>, landing: u64| {
            tracer.call(caller, saved, f, data, args, landing, CALL_LIMIT)
        };
    // 1. Map the trampoline page within reach of the driver, and put the landing in it: every
    //    later call returns there. This first call returns to address 0 (microseconds).
    let step = "mapping the trampoline page";
    let maps = maps_of(pid).map_err(|e| (step, e))?;
    let prot = (libc::PROT_READ | libc::PROT_EXEC) as u64;
    let flags = (libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE) as u64;
    let mut page = None;
    let candidates: Vec<u64> = near
        .iter()
        .flat_map(|&(lo, hi)| {
            target::free_room_near(&maps, lo, hi, PAGE)
                .into_iter()
                .take(16)
        })
        .collect();
    for cand in candidates {
        let got = call(
            tracer,
            libc.mmap,
            &[],
            &|_| vec![cand, PAGE, prot, flags, u64::MAX, 0],
            0,
        )
        .map_err(|e| (step, e))?;
        if got == cand {
            page = Some(cand);
            break;
        }
        if got < u64::MAX - 4095 {
            // An old kernel took the address as a hint only.
            let _ = call(tracer, libc.munmap, &[], &|_| vec![got, PAGE], 0);
        }
    }
    let page = page.ok_or((step, AttachError::NoPageInReach))?;
    j.page = page;
    j.munmap = libc.munmap;
    let mut bytes = vec![0xccu8; PAGE as usize];
    bytes[..LANDING.len()].copy_from_slice(&LANDING);
    tracer.write(page, &bytes).map_err(|e| (step, e))?;
    j.landing = page;
    let landing = page;
    // 2. Load the preload.
    let step = "loading the recorder (dlopen)";
    let handle = call(
        tracer,
        libc.dlopen,
        &cstr(&path),
        &|at| vec![at, RTLD_NOW],
        landing,
    )
    .map_err(|e| (step, e))?;
    if handle == 0 {
        let msg = call(tracer, libc.dlerror, &[], &|_| vec![], landing)
            .ok()
            .and_then(|p| read_cstr(tracer, p))
            .unwrap_or_else(|| "no reason given".into());
        return Err((
            step,
            AttachError::Dlopen {
                path: opts.preload.clone(),
                message: msg,
            },
        ));
    }
    let maps = maps_of(pid).map_err(|e| (step, e))?;
    let (loaded, base) = target::find_object(&maps, "libvramtrace_preload")
        .ok_or((step, AttachError::RecorderNotMapped))?;
    let ours = Symbols::read(&in_target(pid, &loaded), base).map_err(|e| (step, e))?;
    let sym = |symbol: &'static str| {
        ours.get(symbol).ok_or_else(|| {
            (
                step,
                AttachError::RecorderLacks {
                    recorder: loaded.clone(),
                    symbol,
                },
            )
        })
    };
    let (set_real, start, stop, python_fn, python_detached) = (
        sym("vramtrace_attach_real")?,
        sym("vramtrace_attach_start")?,
        sym("vramtrace_attach_stop")?,
        sym("vramtrace_attach_python")?,
        sym("vramtrace_attach_python_detached")?,
    );
    kill_point("loaded");
    // 3. Build the pads and trampolines, one slot each after the landing's.
    let step = "building the trampolines";
    let mut hooks = Vec::new();
    let mut covered = Vec::new();
    let mut left_alone = Vec::new();
    for (i, (name, entry, optional)) in entries.iter().enumerate() {
        let (entry, optional) = (*entry, *optional);
        let slot = page + (i as u64 + 1) * patch::SLOT;
        if slot + patch::SLOT > page + PAGE || i >= journal::MAX_HOOKS {
            return Err((step, AttachError::TooManyHooks));
        }
        let wrapper = ours
            .get(name)
            .ok_or_else(|| (step, AttachError::NoWrapper { name: name.clone() }))?;
        let prologue = tracer
            .read(entry, patch::PROLOGUE_READ)
            .map_err(|e| (step, e))?;
        let tramp_at = slot + patch::TRAMPOLINE_AT;
        let made = patch::trampoline(&prologue, entry, tramp_at)
            .and_then(|t| patch::jump(entry, slot).map(|j| (t, j)))
            .map_err(|reason| AttachError::Hook {
                name: name.clone(),
                entry,
                reason,
            });
        let (t, jump) = match made {
            Ok(m) => m,
            Err(why) if optional => {
                left_alone.push(why);
                continue;
            }
            Err(why) => return Err((step, why)),
        };
        let off = (slot - page) as usize;
        bytes[off..off + 14].copy_from_slice(&patch::pad(wrapper));
        let at = off + patch::TRAMPOLINE_AT as usize;
        bytes[at..at + t.code.len()].copy_from_slice(&t.code);
        // An entry that starts with a jump (a thunk) is moved like any other instruction: the
        // trampoline jumps where it jumped. A jump of ours is never there: a process is
        // attached once.
        let mut original = [0u8; patch::JUMP_LEN];
        original.copy_from_slice(&prologue[..patch::JUMP_LEN]);
        hooks.push(Hook {
            name: name.clone(),
            entry,
            original,
            jump,
        });
        covered.push((entry, t.covered as u64, tramp_at));
    }
    tracer.write(page, &bytes).map_err(|e| (step, e))?;
    // 4. Tell the recorder where the driver's functions now are, and turn it on.
    let step = "handing the trampolines to the recorder";
    for (hook, &(_, _, tramp_at)) in hooks.iter().zip(&covered) {
        let rc = call(
            tracer,
            set_real,
            &cstr(&hook.name),
            &|at| vec![at, tramp_at],
            landing,
        )
        .map_err(|e| (step, e))?;
        // From here the recorder points into the page: it stays.
        j.page = 0;
        if rc as i32 != 0 {
            return Err((
                step,
                AttachError::TrampolineRefused {
                    name: hook.name.clone(),
                    code: rc as i32,
                },
            ));
        }
    }
    let step = "turning recording on";
    let dir = opts.out.to_string_lossy().into_owned();
    let rc = call(
        tracer,
        start,
        &cstr(&dir),
        &|at| vec![at, u64::from(std::process::id())],
        landing,
    )
    .map_err(|e| (step, e))? as i32;
    if rc != 0 {
        let why = StartRefusal::from_code(rc, opts.out.clone());
        return Err((step, AttachError::StartRefused(why)));
    }
    j.stop_fn = stop;
    kill_point("started");
    // 5. A Python program: schedule the probe in its interpreter (it runs once the main thread
    //    is back in the eval loop, under the GIL).
    let mut python = false;
    if let Some(dir) = &opts.python_probe {
        let code = python_starter(dir, &opts.preload);
        let rc = call(tracer, python_fn, &cstr(&code), &|at| vec![at], landing)
            .map_err(|e| ("starting the Python probe", e))? as i32;
        python = rc == 0;
    }
    // 6. Stop everything, keep every thread out of the bytes about to change, write the jumps.
    let step = "writing the jumps";
    let all_started = Instant::now();
    let tids = tracer.stop_all().map_err(|e| (step, e))?;
    for &tid in &tids {
        for _ in 0..=STEP_LIMIT {
            let rip = tracer.rip(tid).map_err(|e| (step, e))?;
            let inside = covered
                .iter()
                .any(|&(entry, len, _)| rip > entry && rip < entry + len);
            if !inside {
                break;
            }
            tracer.step(tid).map_err(|e| (step, e))?;
        }
        let rip = tracer.rip(tid).map_err(|e| (step, e))?;
        if covered
            .iter()
            .any(|&(entry, len, _)| rip > entry && rip < entry + len)
        {
            return Err((step, AttachError::StuckInEntry { tid }));
        }
    }
    for hook in &hooks {
        let now = tracer
            .read(hook.entry, patch::JUMP_LEN)
            .map_err(|e| (step, e))?;
        if now != hook.original {
            return Err((
                step,
                AttachError::ChangedWhileAttaching {
                    name: hook.name.clone(),
                },
            ));
        }
        j.add_hook(hook.entry, &hook.original, &hook.jump);
        tracer
            .write(hook.entry, &hook.jump)
            .map_err(|e| (step, e))?;
    }
    kill_point("patched");
    Ok(Installed {
        hooks,
        stop_fn: stop,
        all_pause: all_started.elapsed(),
        threads: tids.len(),
        python,
        python_at: (python_fn, python_detached),
        left_alone,
    })
}

#[cfg(target_arch = "x86_64")]
fn read_cstr(tracer: &Tracer, at: u64) -> Option<String> {
    if at == 0 {
        return None;
    }
    let bytes = tracer.read(at, 512).ok()?;
    let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    Some(String::from_utf8_lossy(&bytes[..end]).into_owned())
}

/// Detaches: stops every thread, writes back the original bytes of each entry point (one that
/// is no longer our jump is left as found and named), turns recording off, lets the process go.
#[cfg(not(target_arch = "x86_64"))]
pub fn detach(attached: Attached) -> Result<Detached, AttachError> {
    Err(not_here(attached.pid))
}

/// Detaches: stops every thread, writes back the original bytes of each entry point (one that
/// is no longer our jump is left as found and named), turns recording off, lets the process go.
#[cfg(target_arch = "x86_64")]
pub fn detach(mut attached: Attached) -> Result<Detached, AttachError> {
    let pid = attached.pid;
    let failed = |step: &'static str| {
        move |cause: AttachError| AttachError::DetachFailed {
            pid,
            step,
            cause: Box::new(cause),
        }
    };
    let gone = || {
        std::fs::read_to_string(format!("/proc/{pid}/status")).map_or(true, |s| {
            s.lines()
                .any(|l| l.starts_with("State:") && l.contains('Z'))
        })
    };
    let started = Instant::now();
    let exited = |attached: Attached| {
        let children = detach_children(&attached);
        attached.watched.finish();
        Ok(Detached {
            pause: Duration::ZERO,
            changed_by_others: Vec::new(),
            exited: true,
            children,
            python: PythonDetach::NotStarted,
        })
    };
    if gone() {
        return exited(attached);
    }
    let mut tracer = match Tracer::new(pid) {
        Ok(t) => t,
        Err(_) if gone() => return exited(attached),
        Err(e) => return Err(failed("opening its memory")(e)),
    };
    // The Python probe's detach(), scheduled in the interpreter (it runs once the main thread is
    // back in its eval loop), with only the main thread stopped, as at attach: scheduling it
    // allocates, and a thread stopped inside malloc must not hold us up.
    let mut python_scheduled = false;
    if attached.python && matches!(tracer.stop(pid), Ok(true)) {
        let saved = tracer.save(pid).map_err(failed("saving the registers"))?;
        let j = attached.watched.journal();
        j.save_regs(pid, &saved);
        j.regs_changed = 1;
        let rc = tracer.call(
            pid,
            &saved,
            attached.python_at.0,
            &cstr(&python_stopper()),
            |at| vec![at],
            attached.landing,
            CALL_LIMIT,
        );
        let restored = tracer.restore(pid, &saved);
        tracer.release(pid);
        restored.map_err(failed("restoring the registers"))?;
        attached.watched.journal().regs_changed = 0;
        python_scheduled = rc.is_ok_and(|rc| rc as i32 == 0);
    }
    let tids = match tracer.stop_all() {
        Ok(t) if !t.is_empty() => t,
        Ok(_) => return exited(attached),
        Err(_) if gone() => return exited(attached),
        Err(e) => return Err(failed("stopping the threads")(e)),
    };
    kill_point("detaching");
    let mut changed_by_others = Vec::new();
    for hook in &attached.hooks {
        let now = tracer
            .read(hook.entry, patch::JUMP_LEN)
            .map_err(failed("reading the entry points"))?;
        if now != hook.jump {
            changed_by_others.push(hook.name.clone());
            continue;
        }
        tracer
            .write(hook.entry, &hook.original)
            .map_err(failed("restoring the entry points"))?;
    }
    let j = attached.watched.journal();
    j.n_hooks = 0;
    let caller = if tids.contains(&pid) { pid } else { tids[0] };
    let saved = tracer
        .save(caller)
        .map_err(failed("saving the registers"))?;
    j.save_regs(caller, &saved);
    j.regs_changed = 1;
    let off = tracer.call(
        caller,
        &saved,
        attached.stop_fn,
        &[],
        |_| vec![],
        attached.landing,
        CALL_LIMIT,
    );
    let restored = tracer.restore(caller, &saved);
    tracer.release_all();
    let pause = started.elapsed();
    off.map_err(failed("turning recording off"))?;
    restored.map_err(failed("restoring the registers"))?;
    let j = attached.watched.journal();
    j.regs_changed = 0;
    j.stop_fn = 0;
    let python = if python_scheduled {
        wait_python_detach(pid, attached.python_at.1, python_detach_wait())
    } else {
        PythonDetach::NotStarted
    };
    let children = detach_children(&attached);
    attached.watched.finish();
    Ok(Detached {
        pause,
        changed_by_others,
        exited: false,
        children,
        python,
    })
}

/// Waits up to `wait` for the Python probe's `detach()` to report through the preload's
/// `vramtrace_attach_python_detached` (at `at` in process `pid`), reading it every 2 ms.
#[cfg(target_arch = "x86_64")]
fn wait_python_detach(pid: i32, at: u64, wait: Duration) -> PythonDetach {
    use std::os::unix::fs::FileExt;
    let started = Instant::now();
    let Ok(mem) = std::fs::File::open(format!("/proc/{pid}/mem")) else {
        return PythonDetach::NotStarted;
    };
    loop {
        let mut b = [0u8; 4];
        if mem.read_exact_at(&mut b, at).is_err() {
            // The process is gone.
            return PythonDetach::NotStarted;
        }
        let flags = u32::from_le_bytes(b);
        if flags != 0 {
            return PythonDetach::Done {
                after: started.elapsed(),
                gpu_trace_stays: flags & 2 != 0,
                native_off: flags & 4 != 0,
                error: flags & 8 != 0,
                removed: flags & 16 != 0,
            };
        }
        if started.elapsed() >= wait {
            return PythonDetach::NotInTime {
                waited: started.elapsed(),
            };
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// The descendants of `pid` that carry this attach's hooks: forked while attached, so they
/// hold the recorder with its state `attached` by this process.
fn attached_descendants(pid: i32) -> Vec<i32> {
    let mut parent_of = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(p) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<i32>().ok())
        else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{p}/stat")) else {
            continue;
        };
        let ppid = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1)?.parse::<i32>().ok());
        if let Some(ppid) = ppid {
            parent_of.push((p, ppid));
        }
    }
    let mut family = vec![pid];
    let mut i = 0;
    while i < family.len() {
        let p = family[i];
        family.extend(
            parent_of
                .iter()
                .filter(|&&(_, pp)| pp == p)
                .map(|&(c, _)| c),
        );
        i += 1;
    }
    let me = std::process::id();
    family
        .into_iter()
        .skip(1)
        .filter(|&c| {
            let Ok(maps) = maps_of(c) else { return false };
            target::find_object(&maps, "libvramtrace_preload")
                .is_some_and(|(path, base)| attach_state(c, &path, base) == Some((1, me)))
        })
        .collect()
}

/// Detaches every child forked while attached (the same hooks at the same addresses: a fork
/// copies the address space).
#[cfg(target_arch = "x86_64")]
fn detach_children(attached: &Attached) -> Vec<(i32, Result<(), AttachError>)> {
    attached_descendants(attached.pid)
        .into_iter()
        .map(|child| (child, detach_copy(attached, child)))
        .collect()
}

/// Detaches process `pid`, a fork of the attached process.
#[cfg(target_arch = "x86_64")]
fn detach_copy(attached: &Attached, pid: i32) -> Result<(), AttachError> {
    let mut tracer = Tracer::new(pid)?;
    let tids = tracer.stop_all()?;
    let Some(&caller) = tids.iter().find(|&&t| t == pid).or(tids.first()) else {
        return Ok(());
    };
    for hook in &attached.hooks {
        if tracer.read(hook.entry, patch::JUMP_LEN)? == hook.jump {
            tracer.write(hook.entry, &hook.original)?;
        }
    }
    let saved = tracer.save(caller)?;
    let off = tracer.call(
        caller,
        &saved,
        attached.stop_fn,
        &[],
        |_| vec![],
        attached.landing,
        CALL_LIMIT,
    );
    let restored = tracer.restore(caller, &saved);
    tracer.release_all();
    off?;
    restored
}
