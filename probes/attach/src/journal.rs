//! The journal of an attach, in memory shared with a watchdog process, and the watchdog.
//!
//! Everything `attach` changes in the target is written here before it is changed: which
//! thread runs the calls and its saved registers, the trampoline page, whether recording was
//! turned on, each entry point's original bytes. The watchdog, forked before the target is
//! touched, blocks reading a pipe whose only writer is `vramtrace`; when `vramtrace` ends
//! without saying it finished (killed, crashed), the read returns and the watchdog puts the
//! target back from the journal: it stops every thread, lets a call in flight finish into the
//! landing (`ptrace::LANDING`), writes back the original bytes, turns recording off, restores
//! the calling thread's registers and lets the process go. A target is never left stopped:
//! the kernel lets a seized thread go when its tracer dies, and the landing parks the calling
//! thread in `pause()` rather than letting it return into nothing.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use nix::errno::Errno;

use crate::AttachError;
use crate::ptrace::{SavedRegs, Tracer};

/// Nothing is changed yet, or everything is put back.
pub const IDLE: u32 = 0;
/// Threads are stopped or a call is in flight: a dead `vramtrace` leaves work to undo.
pub const CHANGING: u32 = 1;
/// Attached and running: a dead `vramtrace` leaves the hooks to remove.
pub const ATTACHED: u32 = 2;
/// Done: the watchdog has nothing to do.
pub const FINISHED: u32 = 3;

/// Entry points a journal holds.
pub const MAX_HOOKS: usize = 30;
const XSTATE_MAX: usize = 1 << 15;

/// The journal (one shared page range, `#[repr(C)]`, written only by `vramtrace`, read by the
/// watchdog after `vramtrace` is gone).
#[repr(C)]
pub struct Journal {
    /// [`IDLE`], [`CHANGING`], [`ATTACHED`] or [`FINISHED`].
    pub phase: AtomicU32,
    /// The target.
    pub pid: i32,
    /// The thread the calls run on (0: none stopped yet).
    pub caller: i32,
    /// 1 while the caller's registers are not its own (a call set up or in flight).
    pub regs_changed: u32,
    /// The landing in the trampoline page (0: not there yet).
    pub landing: u64,
    /// The trampoline page and `munmap`, while nothing points into it (0: keep it).
    pub page: u64,
    /// `munmap` in the target.
    pub munmap: u64,
    /// `vramtrace_attach_stop`, once recording is on (0: off).
    pub stop_fn: u64,
    /// Entry points holding our jump (or about to): address, original bytes, jump.
    pub n_hooks: u32,
    /// The entry points' addresses.
    pub entry: [u64; MAX_HOOKS],
    /// Their original first bytes.
    pub original: [[u8; 8]; MAX_HOOKS],
    /// The jumps written there.
    pub jump: [[u8; 8]; MAX_HOOKS],
    /// The caller's saved general registers.
    pub regs: libc::user_regs_struct,
    /// Bytes of `xstate` in use.
    pub xstate_len: u32,
    /// The caller's saved extended state.
    pub xstate: [u8; XSTATE_MAX],
}

/// A journal in a shared anonymous mapping, and the watchdog watching it.
pub struct Watched {
    journal: *mut Journal,
    /// The write end of the pipe the watchdog reads; closed when done.
    pipe: libc::c_int,
    watchdog: libc::pid_t,
}

// Safety: the journal is only written by the thread that owns `Watched`.
unsafe impl Send for Watched {}

impl Watched {
    /// Maps a journal for `pid` and forks its watchdog. No watchdog is forked when this
    /// process has more than one thread (forking it would not be safe) or the pipe or the fork
    /// fails; `Err` when not even the journal can be mapped.
    pub fn start(pid: i32) -> Result<Watched, AttachError> {
        let threads = std::fs::read_dir("/proc/self/task")
            .map(|d| d.count())
            .unwrap_or(0);
        let size = size_of::<Journal>();
        // Safety: an anonymous shared mapping of our own; zero-filled, which is a valid Journal
        // (all integers and arrays).
        let p = unsafe {
            libc::mmap(
                core::ptr::null_mut(),
                size,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(AttachError::Journal {
                errno: Errno::last(),
            });
        }
        let journal = p as *mut Journal;
        // Safety: the mapping is ours and large enough.
        unsafe { (*journal).pid = pid };
        let alone = Watched {
            journal,
            pipe: -1,
            watchdog: 0,
        };
        let mut fds = [0; 2];
        // Safety: a valid array of two descriptors.
        if threads != 1 || unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
            return Ok(alone);
        }
        // Safety: this process has one thread (checked above), so the child may run Rust code.
        let child = unsafe { libc::fork() };
        if child < 0 {
            // Safety: our own descriptors.
            unsafe {
                libc::close(fds[0]);
                libc::close(fds[1]);
            }
            return Ok(alone);
        }
        if child == 0 {
            // Safety: the child's own copies.
            unsafe { libc::close(fds[1]) };
            watchdog(fds[0], journal);
        }
        // Safety: the parent's copy of the read end.
        unsafe { libc::close(fds[0]) };
        // `alone` is only a template: its mapping now belongs to the value returned.
        core::mem::forget(alone);
        Ok(Watched {
            journal,
            pipe: fds[1],
            watchdog: child,
        })
    }

    /// Whether a watchdog process watches this attach.
    pub fn has_watchdog(&self) -> bool {
        self.watchdog > 0
    }

    /// The journal.
    pub fn journal(&mut self) -> &mut Journal {
        // Safety: the mapping lives as long as `self`; only this thread writes it.
        unsafe { &mut *self.journal }
    }

    /// Says that the target needs nothing more and lets the watchdog go.
    pub fn finish(mut self) {
        self.journal().phase.store(FINISHED, Ordering::SeqCst);
    }
}

impl Drop for Watched {
    /// Without [`Watched::finish`] (a panic on the way), the watchdog finds the phase as it
    /// was and puts the target back.
    fn drop(&mut self) {
        if self.watchdog > 0 {
            // Safety: our descriptor; the child sees EOF, reads FINISHED and exits.
            unsafe { libc::close(self.pipe) };
            let mut status = 0;
            // Safety: reaping our own child.
            unsafe { libc::waitpid(self.watchdog, &mut status, 0) };
        }
        // Safety: the mapping made in `start`.
        unsafe { libc::munmap(self.journal as *mut libc::c_void, size_of::<Journal>()) };
    }
}

impl Journal {
    /// Records the caller's saved registers.
    pub fn save_regs(&mut self, tid: i32, saved: &SavedRegs) {
        self.caller = tid;
        self.regs = saved.regs;
        let n = saved.xstate.len().min(XSTATE_MAX);
        self.xstate[..n].copy_from_slice(&saved.xstate[..n]);
        self.xstate_len = n as u32;
    }

    /// The caller's saved registers.
    pub fn saved_regs(&self) -> SavedRegs {
        SavedRegs {
            regs: self.regs,
            xstate: self.xstate[..self.xstate_len as usize].to_vec(),
        }
    }

    /// Records an entry point before its jump is written.
    pub fn add_hook(&mut self, entry: u64, original: &[u8], jump: &[u8]) {
        let i = self.n_hooks as usize;
        self.entry[i] = entry;
        self.original[i][..original.len()].copy_from_slice(original);
        self.jump[i][..jump.len()].copy_from_slice(jump);
        self.n_hooks += 1;
    }
}

/// The watchdog: waits for `vramtrace` to go, then, unless it finished, puts the target back.
fn watchdog(pipe: libc::c_int, journal: *const Journal) -> ! {
    // Ctrl-C in the terminal reaches the whole process group: the watchdog must outlive it.
    // Safety: plain signal dispositions.
    unsafe {
        for s in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGPIPE] {
            libc::signal(s, libc::SIG_IGN);
        }
    }
    let mut b = [0u8; 1];
    loop {
        // Safety: reading into a one-byte buffer of ours.
        let n = unsafe { libc::read(pipe, b.as_mut_ptr() as *mut libc::c_void, 1) };
        if n == 0
            || (n < 0 && std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted)
        {
            break;
        }
    }
    // Safety: the shared mapping stays mapped in this process; its writer is gone.
    let j = unsafe { &*journal };
    let phase = j.phase.load(Ordering::SeqCst);
    let alive = std::fs::read_to_string(format!("/proc/{}/status", j.pid)).is_ok_and(|s| {
        !s.lines()
            .any(|l| l.starts_with("State:") && l.contains('Z'))
    });
    if alive && (phase == CHANGING || phase == ATTACHED) {
        let done = recover(j);
        let line = match done {
            Ok(()) => format!(
                "vramtrace: watchdog: vramtrace ended while attached to process {}; the process is restored and running\n",
                j.pid
            ),
            Err(e) => format!(
                "vramtrace: watchdog: vramtrace ended while attached to process {}; restoring it failed: {e}\n",
                j.pid
            ),
        };
        // Safety: writing a buffer to stderr.
        unsafe { libc::write(2, line.as_ptr() as *const libc::c_void, line.len()) };
    }
    // Safety: ends the child without running the parent's atexit handlers.
    unsafe { libc::_exit(0) }
}

/// Puts the target back from the journal.
fn recover(j: &Journal) -> Result<(), AttachError> {
    let pid = j.pid;
    // The kernel detaches the target from its dead tracer; wait until it has.
    for _ in 0..5000 {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        if status.is_empty() {
            return Err(AttachError::ProcessGone);
        }
        let tracer = status
            .lines()
            .find_map(|l| l.strip_prefix("TracerPid:"))
            .map(str::trim)
            .unwrap_or("0");
        if tracer == "0" {
            break;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    let mut tracer = Tracer::new(pid)?;
    let tids = tracer.stop_all()?;
    let mut problems = Vec::new();
    // The thread that ran the calls: let a call in flight finish into the landing.
    let caller = j.caller;
    let mut parked = false;
    if caller != 0 && j.regs_changed != 0 && tids.contains(&caller) && j.landing != 0 {
        parked = tracer.finish_call(caller, j.landing, Duration::from_secs(10))?;
    }
    for i in 0..j.n_hooks as usize {
        let (entry, original, jump) = (j.entry[i], &j.original[i][..5], &j.jump[i][..5]);
        if tracer.read(entry, 5)? == jump {
            tracer.write(entry, original)?;
        }
    }
    // The thread to call on: the caller, parked; or, when its registers are its own, any.
    let call_on = if parked {
        Some(caller)
    } else if j.regs_changed == 0 {
        tids.first().copied()
    } else {
        problems.push(AttachError::CallerNotParked { tid: caller });
        tids.iter().copied().find(|&t| t != caller)
    };
    if let Some(tid) = call_on.filter(|_| j.landing != 0) {
        let saved = if parked {
            j.saved_regs()
        } else {
            tracer.save(tid)?
        };
        let limit = Duration::from_secs(10);
        if j.stop_fn != 0
            && let Err(e) = tracer.call(tid, &saved, j.stop_fn, &[], |_| vec![], j.landing, limit)
        {
            problems.push(AttachError::RecordingStaysOn { cause: Box::new(e) });
        }
        if j.page != 0
            && let Err(e) =
                tracer.call(tid, &saved, j.munmap, &[], |_| vec![j.page, 4096], 0, limit)
        {
            problems.push(AttachError::PageStays {
                page: j.page,
                cause: Box::new(e),
            });
        }
        tracer.restore(tid, &saved)?;
    }
    tracer.release_all();
    if problems.is_empty() {
        Ok(())
    } else {
        Err(AttachError::NotRestored(problems))
    }
}
