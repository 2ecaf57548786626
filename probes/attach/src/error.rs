//! What can go wrong: [`AttachError`] and the reasons it carries.
//!
//! Every message is whole: it includes the message of what caused it (kept in the variant's
//! fields for a caller that wants to look), so no variant has a `source()`, and printing one
//! with its causes (anyhow's `{:#}`) repeats nothing.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use nix::errno::Errno;

use crate::patch::JUMP_LEN;

/// Why attaching or detaching did not happen, or what failed on the way.
///
/// [`Refused`](AttachError::Refused), [`Failed`](AttachError::Failed) and
/// [`DetachFailed`](AttachError::DetachFailed) say which process and what became of it, and
/// hold the error that caused it: one of the other variants.
#[derive(Debug, thiserror::Error)]
pub enum AttachError {
    /// Nothing was touched: the process may not or need not be attached, or something attaching
    /// needs is missing.
    #[error("cannot attach to process {pid}: {cause}")]
    Refused {
        /// The process.
        pid: i32,
        /// Why.
        cause: Box<AttachError>,
    },
    /// A step of the attach failed once the process was being changed.
    #[error("attaching to process {pid} failed at {step}: {cause}{undo}")]
    Failed {
        /// The process.
        pid: i32,
        /// The step that failed.
        step: &'static str,
        /// What went wrong.
        cause: Box<AttachError>,
        /// What became of the steps done before it.
        undo: Undo,
    },
    /// A step of the detach failed.
    #[error("detaching from process {pid} failed at {step}: {cause}")]
    DetachFailed {
        /// The process.
        pid: i32,
        /// The step that failed.
        step: &'static str,
        /// What went wrong.
        cause: Box<AttachError>,
    },

    /// The process is not one vramtrace attaches to (it said why before touching anything).
    #[error("{0}")]
    NotEligible(Ineligible),

    /// The kernel refused to trace a thread: `PTRACE_SEIZE` returned `EPERM`.
    #[error(
        "the kernel refused to trace thread {tid} (EPERM): another tracer holds it, or ptrace is \
         restricted here (docs/deploy.md)"
    )]
    TraceDenied {
        /// The thread.
        tid: i32,
    },
    /// A ptrace request failed.
    #[error("{request} on thread {tid}: {}", errno.desc())]
    Ptrace {
        /// The request (`PTRACE_SEIZE`, `PTRACE_GETREGS`, ...).
        request: &'static str,
        /// The thread.
        tid: i32,
        /// What the kernel said.
        errno: Errno,
    },
    /// Waiting for a traced thread to stop (`waitpid`) failed.
    #[error("waiting for thread {tid} {during}: {}", errno.desc())]
    Wait {
        /// The thread.
        tid: i32,
        /// What it was doing.
        during: &'static str,
        /// What the kernel said.
        errno: Errno,
    },
    /// A traced thread exited (the process ended, or the thread did).
    #[error("thread {tid} of the target exited {during}")]
    Exited {
        /// The thread.
        tid: i32,
        /// What it was doing.
        during: &'static str,
    },
    /// The process kept creating threads while they were being stopped.
    #[error("the process kept creating threads faster than they could be stopped")]
    ThreadsKeepComing,
    /// Every thread of the process exited before it could be stopped.
    #[error("no thread of it could be stopped")]
    NoThreadStopped,
    /// A thread stayed inside the bytes about to change, single step after single step.
    #[error("thread {tid} stays inside a driver entry point's first bytes")]
    StuckInEntry {
        /// The thread.
        tid: i32,
    },
    /// A call into the target did not return in time.
    #[error(
        "a call into the target did not return within {} s (it may be waiting for a lock held \
         where the thread was stopped; the process may need a restart)",
        limit.as_secs_f64()
    )]
    CallTimeout {
        /// How long it was given.
        limit: Duration,
    },
    /// The target faulted during a call into it.
    #[error("the target faulted at {rip:#x} during a call into it")]
    CallFaulted {
        /// Where.
        rip: u64,
    },

    /// `/proc/PID/mem` could not be opened.
    #[error("cannot open /proc/{pid}/mem: {error}")]
    OpenMemory {
        /// The process.
        pid: i32,
        /// Why.
        error: std::io::Error,
    },
    /// `/proc/PID/task` could not be listed.
    #[error("cannot list the threads of process {pid}: {error}")]
    ListThreads {
        /// The process.
        pid: i32,
        /// Why.
        error: std::io::Error,
    },
    /// `/proc/PID/maps` could not be read.
    #[error(
        "cannot read the memory map of process {pid} ({error}); run vramtrace as its user or as root"
    )]
    MemoryMap {
        /// The process.
        pid: i32,
        /// Why.
        error: std::io::Error,
    },
    /// The target's memory could not be read.
    #[error("cannot read {len} bytes at {addr:#x} of the target: {error}")]
    ReadMemory {
        /// Where.
        addr: u64,
        /// How many bytes.
        len: usize,
        /// Why.
        error: std::io::Error,
    },
    /// The target's memory could not be written.
    #[error("cannot write {len} bytes at {addr:#x} of the target: {error}")]
    WriteMemory {
        /// Where.
        addr: u64,
        /// How many bytes.
        len: usize,
        /// Why.
        error: std::io::Error,
    },
    /// The shared memory of the attach's journal could not be mapped.
    #[error("cannot map the journal of the attach: {}", errno.desc())]
    Journal {
        /// What `mmap` said.
        errno: Errno,
    },

    /// A shared object's file could not be read.
    #[error("cannot read {}: {error}", path.display())]
    ReadObject {
        /// The file (as the target sees it, through `/proc/PID/root`).
        path: PathBuf,
        /// Why.
        error: std::io::Error,
    },
    /// A shared object's file is not an ELF file that can be read here.
    #[error("{} is not an ELF file this vramtrace reads: {error}", path.display())]
    NotElf {
        /// The file.
        path: PathBuf,
        /// What the ELF reader said.
        error: object::Error,
    },
    /// A shared object does not export a symbol attaching needs.
    #[error("{} exports no {symbol}", object.display())]
    MissingSymbol {
        /// The object, as the target maps it.
        object: PathBuf,
        /// The symbol.
        symbol: &'static str,
    },

    /// No free page for the trampolines is within a jump's reach of the driver's code.
    #[error("no free page within reach of the driver's code")]
    NoPageInReach,
    /// More entry points to hook than one page of trampolines (or the journal) holds.
    #[error("more entry points than one page of trampolines holds")]
    TooManyHooks,
    /// An entry point cannot be hooked.
    #[error("cannot hook {name} at {entry:#x}: {reason}")]
    Hook {
        /// The function.
        name: String,
        /// Its address in the target.
        entry: u64,
        /// Why.
        reason: TrampolineError,
    },
    /// An entry point's first bytes changed between reading them and writing the jump.
    #[error("{name} changed while attaching")]
    ChangedWhileAttaching {
        /// The function.
        name: String,
    },

    /// `dlopen` of the recorder in the target returned no handle.
    #[error(
        "dlopen of {} in the target failed: {message} (the target must see that path: in a \
         container, put the library inside it)",
        path.display()
    )]
    Dlopen {
        /// The recorder's path.
        path: PathBuf,
        /// What `dlerror` said in the target.
        message: String,
    },
    /// `dlopen` succeeded but the recorder is not in the target's memory map.
    #[error("the recorder is not in the target's memory map after dlopen")]
    RecorderNotMapped,
    /// The loaded recorder lacks one of the attach entry points.
    #[error("the recorder at {} lacks {symbol}: is it this vramtrace's?", recorder.display())]
    RecorderLacks {
        /// The recorder as the target maps it.
        recorder: PathBuf,
        /// The entry point.
        symbol: &'static str,
    },
    /// The recorder has no wrapper of a driver function that was to be hooked.
    #[error("the recorder has no wrapper for {name}")]
    NoWrapper {
        /// The driver function.
        name: String,
    },
    /// The recorder refused the trampoline of an entry point (`vramtrace_attach_real`).
    #[error("the recorder refused the trampoline of {name} ({code})")]
    TrampolineRefused {
        /// The driver function.
        name: String,
        /// What it returned.
        code: i32,
    },
    /// The recorder refused to start recording (`vramtrace_attach_start`).
    #[error("the recorder refused: {0}")]
    StartRefused(StartRefusal),

    /// Undoing: recording could not be turned off.
    #[error("recording could not be turned off: {cause}")]
    RecordingStaysOn {
        /// Why.
        cause: Box<AttachError>,
    },
    /// Undoing: the trampoline page could not be unmapped.
    #[error("one page at {page:#x} stays mapped: {cause}")]
    PageStays {
        /// The page.
        page: u64,
        /// Why.
        cause: Box<AttachError>,
    },
    /// Recovering: the thread that ran the calls was not found finishing one, so the registers
    /// saved before the call were not put back.
    #[error("thread {tid} was not found finishing a call; its registers were left as they are")]
    CallerNotParked {
        /// The thread.
        tid: i32,
    },
    /// Recovering: the process is gone.
    #[error("the process is gone")]
    ProcessGone,
    /// Recovering: what could not be put back.
    #[error("{}", Joined(.0))]
    NotRestored(Vec<AttachError>),
}

impl AttachError {
    /// Nothing was touched in process `pid`: `cause` says why.
    pub(crate) fn refused(pid: i32, cause: impl Into<AttachError>) -> AttachError {
        AttachError::Refused {
            pid,
            cause: Box::new(cause.into()),
        }
    }
}

impl From<Ineligible> for AttachError {
    fn from(why: Ineligible) -> AttachError {
        AttachError::NotEligible(why)
    }
}

/// Why a process is not one vramtrace attaches to.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Ineligible {
    /// Not a process id (0, negative), or vramtrace's own.
    #[error("that is not a process vramtrace can attach to")]
    NotAProcess,
    /// No process has that id.
    #[error("no process with that id is running")]
    NoSuchProcess,
    /// A zombie.
    #[error("it has exited (a zombie waiting for its parent); nothing to attach to")]
    Exited,
    /// It runs a set-user-ID or set-group-ID program, or changed its ids.
    #[error(
        "it runs a set-user-ID or set-group-ID program (or changed its ids); vramtrace never \
         injects code into a process with privileges its caller may not have"
    )]
    Privileged,
    /// Something traces it already.
    #[error(
        "it is already traced by process {by} (a debugger, strace, or another vramtrace attach); \
         detach that first"
    )]
    Traced {
        /// The tracer.
        by: u32,
    },
    /// It runs as another user and vramtrace lacks `CAP_SYS_PTRACE`.
    #[error(
        "it runs as user {target} and vramtrace as user {ours}; run vramtrace as that user, or as \
         root (CAP_SYS_PTRACE)"
    )]
    OtherUser {
        /// The target's effective user id.
        target: u32,
        /// vramtrace's effective user id.
        ours: u32,
    },
    /// Yama's `ptrace_scope` forbids it.
    #[error("{}", scope_reason(*.scope))]
    PtraceScope {
        /// `/proc/sys/kernel/yama/ptrace_scope`.
        scope: u32,
    },
    /// vramtrace is attached to it already.
    #[error("vramtrace is attached to it already (by process {by}); end that one first (Ctrl-C)")]
    AlreadyAttached {
        /// The `vramtrace` process attached.
        by: u32,
    },
    /// vramtrace was attached to it before and detached.
    #[error(
        "vramtrace was attached to it before and detached; attaching to the same process a \
         second time is not supported: its first trace is complete"
    )]
    AttachedBefore,
    /// It has the recorder loaded from its start (`vramtrace run`).
    #[error(
        "it already has vramtrace's recorder loaded ({}): it runs under `vramtrace run`, whose \
         trace already records everything",
        recorder.display()
    )]
    UnderRun {
        /// The recorder it has loaded.
        recorder: PathBuf,
    },
    /// It has not loaded the CUDA driver.
    #[error(
        "it has not loaded the CUDA driver (libcuda.so.1): there is nothing to record yet; attach \
         once it has initialised CUDA, or start it with `vramtrace run`"
    )]
    NoDriver,
    /// It has no glibc.
    #[error("it has no glibc (libc.so.6) loaded; vramtrace attaches to glibc programs only")]
    NoGlibc,
    /// Its driver has none of the entry points the recorder wraps.
    #[error(
        "its driver {} has none of the allocation entry points vramtrace records",
        driver.display()
    )]
    NoEntryPoints {
        /// The driver.
        driver: PathBuf,
    },
    /// Attaching is implemented on x86-64 only.
    #[error(
        "attaching is supported on x86-64 only, and this is {arch}; use `vramtrace run` to start \
         the program under the recorder instead"
    )]
    Unsupported {
        /// This machine's architecture.
        arch: &'static str,
    },
}

fn scope_reason(scope: u32) -> String {
    match scope {
        1 => "/proc/sys/kernel/yama/ptrace_scope is 1: only a parent process or one with \
              CAP_SYS_PTRACE may attach; run vramtrace as root (in a container: --cap-add \
              SYS_PTRACE), or set the sysctl to 0 on a machine you own (docs/deploy.md)"
            .into(),
        2 => "/proc/sys/kernel/yama/ptrace_scope is 2: only a process with CAP_SYS_PTRACE may \
              attach; run vramtrace as root (in a container: --cap-add SYS_PTRACE)"
            .into(),
        3 => "/proc/sys/kernel/yama/ptrace_scope is 3: the kernel forbids attaching to any \
              process until reboot"
            .into(),
        other => format!("/proc/sys/kernel/yama/ptrace_scope is {other}: it forbids attaching"),
    }
}

/// Why an entry point's first instructions cannot be moved into a trampoline.
#[derive(Debug, Clone, thiserror::Error)]
pub enum TrampolineError {
    /// The bytes read ran out before a whole instruction.
    #[error("its first instructions could not be decoded")]
    Undecodable,
    /// Not x86-64 code.
    #[error("its first bytes are not valid x86-64 code ({bytes:02x?})")]
    Invalid {
        /// Its first bytes (up to 8).
        bytes: Vec<u8>,
    },
    /// The function returns or jumps away before the jump's length.
    #[error("it is shorter than the {JUMP_LEN}-byte jump a hook needs (it ends after {len} bytes)")]
    TooShort {
        /// Where it ends.
        len: usize,
    },
    /// A breakpoint among the first bytes.
    #[error("its first bytes hold a breakpoint (is a debugger attached?)")]
    Breakpoint,
    /// The jump back to the rest of the function could not be built.
    #[error("cannot build the jump back: {0}")]
    JumpBack(iced_x86::IcedError),
    /// The encoder could not place the instructions at the trampoline (a relocation out of
    /// reach, say).
    #[error("its first instructions cannot be moved: {0}")]
    Unmovable(iced_x86::IcedError),
    /// The relocated instructions are longer than a trampoline's room.
    #[error("its first instructions do not fit a trampoline ({len} bytes, room for {room})")]
    TooLong {
        /// Bytes they took.
        len: usize,
        /// Bytes there are.
        room: usize,
    },
    /// The entry point is farther than a `jmp rel32` reaches from the trampoline page.
    #[error("it is out of a jump's reach of the trampoline page")]
    OutOfReach,
}

/// What the recorder's `vramtrace_attach_start` answered when it would not start.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StartRefusal {
    /// -3.
    #[error("it already records from its environment (vramtrace run)")]
    RecordsAlready,
    /// -4.
    #[error("it runs in secure mode (set-user-ID or file capabilities)")]
    SecureMode,
    /// -5.
    #[error("the trace directory {} is not an absolute path", dir.display())]
    RelativeDir {
        /// The directory handed to it.
        dir: PathBuf,
    },
    /// -6.
    #[error("vramtrace was attached to it before")]
    AttachedBefore,
    /// Anything else.
    #[error("code {0}")]
    Other(i32),
}

impl StartRefusal {
    /// The refusal `vramtrace_attach_start` means by `code` (not 0), having been handed `dir`.
    pub fn from_code(code: i32, dir: PathBuf) -> StartRefusal {
        match code {
            -3 => StartRefusal::RecordsAlready,
            -4 => StartRefusal::SecureMode,
            -5 => StartRefusal::RelativeDir { dir },
            -6 => StartRefusal::AttachedBefore,
            other => StartRefusal::Other(other),
        }
    }
}

/// What became of the steps done before one that failed.
#[derive(Debug)]
pub enum Undo {
    /// Nothing was undone here: nothing had changed yet, or the step was the last one (putting
    /// back the registers of the thread that ran the calls), whose failure the watchdog sees.
    Nothing,
    /// Everything done before was undone.
    Done,
    /// Undoing left these.
    Left(Vec<AttachError>),
}

impl fmt::Display for Undo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Undo::Nothing => Ok(()),
            Undo::Done => f.write_str("; everything done before was undone"),
            Undo::Left(left) => write!(f, "; undoing it left: {}", Joined(left)),
        }
    }
}

/// Errors one after another, `; ` between them.
struct Joined<'a>(&'a [AttachError]);

impl fmt::Display for Joined<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{e}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_carry_their_causes_in_order() {
        let e = AttachError::Failed {
            pid: 42,
            step: "writing the jumps",
            cause: Box::new(AttachError::StuckInEntry { tid: 43 }),
            undo: Undo::Left(vec![
                AttachError::WriteMemory {
                    addr: 0x1000,
                    len: 5,
                    error: std::io::Error::from_raw_os_error(libc::EIO),
                },
                AttachError::RecordingStaysOn {
                    cause: Box::new(AttachError::CallTimeout {
                        limit: Duration::from_secs(20),
                    }),
                },
            ]),
        };
        let text = e.to_string();
        assert!(
            text.starts_with(
                "attaching to process 42 failed at writing the jumps: thread 43 stays inside a \
                 driver entry point's first bytes; undoing it left: cannot write 5 bytes at 0x1000 \
                 of the target: "
            ),
            "{text}"
        );
        assert!(
            text.contains("; recording could not be turned off: a call into the target did not return within 20 s"),
            "{text}"
        );
        // Whole messages: nothing for a chain printer to repeat.
        assert!(std::error::Error::source(&e).is_none());
    }

    #[test]
    fn a_refusal_names_the_process_and_the_reason() {
        let e = AttachError::refused(7, Ineligible::Traced { by: 99 });
        assert_eq!(
            e.to_string(),
            "cannot attach to process 7: it is already traced by process 99 (a debugger, strace, \
             or another vramtrace attach); detach that first"
        );
        let e = AttachError::refused(
            7,
            AttachError::Ptrace {
                request: "PTRACE_INTERRUPT",
                tid: 8,
                errno: Errno::ESRCH,
            },
        );
        assert_eq!(
            e.to_string(),
            "cannot attach to process 7: PTRACE_INTERRUPT on thread 8: No such process"
        );
    }

    #[test]
    fn the_recorder_s_codes_are_named() {
        assert_eq!(
            StartRefusal::from_code(-5, "rel".into()).to_string(),
            "the trace directory rel is not an absolute path"
        );
        assert_eq!(
            StartRefusal::from_code(-9, "/t".into()),
            StartRefusal::Other(-9)
        );
    }
}
