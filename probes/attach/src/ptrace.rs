//! The tracer: seizing and stopping the target's threads, reading and writing its memory,
//! calling a function in it, and letting it go. x86-64 only.
//!
//! Threads are taken with `PTRACE_SEIZE` and stopped with `PTRACE_INTERRUPT`, so a tracer that
//! dies leaves them running (the kernel detaches a seized thread when its tracer exits); a
//! signal that arrives while a thread is stopped is passed on when it is let go.

use std::collections::BTreeMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::sys::ptrace;
use nix::sys::signal::Signal;
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::Pid;

use crate::AttachError;

/// A stopped thread.
struct Stopped {
    /// A signal it was about to take when it stopped, passed on when it is let go.
    pending: Option<Signal>,
}

/// The general registers and the extended (FPU, SSE, AVX) state of a thread, as saved.
pub struct SavedRegs {
    pub(crate) regs: libc::user_regs_struct,
    pub(crate) xstate: Vec<u8>,
}

/// A process being traced.
pub struct Tracer {
    pid: i32,
    mem: File,
    threads: BTreeMap<i32, Stopped>,
}

/// `NT_X86_XSTATE`: the whole extended state.
const NT_X86_XSTATE: libc::c_int = 0x202;

/// `Err` of a failed ptrace `request` on thread `tid`.
fn failed(request: &'static str, tid: i32) -> impl FnOnce(Errno) -> AttachError {
    move |errno| AttachError::Ptrace {
        request,
        tid,
        errno,
    }
}

/// `PTRACE_GETREGSET` or `PTRACE_SETREGSET` of the x86 extended state of stopped thread `tid`
/// through `buf`; the bytes the kernel read or wrote.
fn xstate_regset(
    request: libc::c_uint,
    name: &'static str,
    tid: i32,
    buf: &mut [u8],
) -> Result<usize, AttachError> {
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr() as *mut libc::c_void,
        iov_len: buf.len(),
    };
    // Safety: a regset request on a stopped tracee with an iovec over a buffer of ours; the
    // kernel reads or writes at most iov_len bytes and sets iov_len to what it used.
    let r = unsafe {
        libc::ptrace(
            request,
            tid,
            NT_X86_XSTATE as usize as *mut libc::c_void,
            &mut iov as *mut libc::iovec as *mut libc::c_void,
        )
    };
    if r < 0 {
        return Err(failed(name, tid)(Errno::last()));
    }
    Ok(iov.iov_len)
}

/// `Err` of a failed `waitpid` on thread `tid`.
fn wait_failed(tid: i32, during: &'static str, errno: Errno) -> AttachError {
    AttachError::Wait { tid, during, errno }
}

impl Tracer {
    /// Opens the target's memory. Nothing is stopped yet.
    pub fn new(pid: i32) -> Result<Tracer, AttachError> {
        let mem = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(format!("/proc/{pid}/mem"))
            .map_err(|error| AttachError::OpenMemory { pid, error })?;
        Ok(Tracer {
            pid,
            mem,
            threads: BTreeMap::new(),
        })
    }

    /// Seizes and stops thread `tid`; `Ok(false)` if it no longer exists.
    pub fn stop(&mut self, tid: i32) -> Result<bool, AttachError> {
        if self.threads.contains_key(&tid) {
            return Ok(true);
        }
        let t = Pid::from_raw(tid);
        match ptrace::seize(t, ptrace::Options::PTRACE_O_TRACESYSGOOD) {
            Ok(()) => {}
            Err(Errno::ESRCH) => return Ok(false),
            Err(Errno::EPERM) => return Err(AttachError::TraceDenied { tid }),
            Err(e) => return Err(failed("PTRACE_SEIZE", tid)(e)),
        }
        if let Err(e) = ptrace::interrupt(t) {
            let _ = ptrace::detach(t, None);
            return Err(failed("PTRACE_INTERRUPT", tid)(e));
        }
        let pending = loop {
            match waitpid(t, Some(WaitPidFlag::__WALL)) {
                Ok(WaitStatus::PtraceEvent(_, _, _)) => break None,
                Ok(WaitStatus::Stopped(_, sig)) => break Some(sig),
                Ok(WaitStatus::Exited(..) | WaitStatus::Signaled(..)) => return Ok(false),
                Ok(_) => continue,
                Err(Errno::EINTR) => continue,
                Err(Errno::ECHILD) => return Ok(false),
                Err(e) => return Err(wait_failed(tid, "to stop", e)),
            }
        };
        self.threads.insert(tid, Stopped { pending });
        Ok(true)
    }

    /// Stops every thread of the process, including those created meanwhile; returns their
    /// ids.
    pub fn stop_all(&mut self) -> Result<Vec<i32>, AttachError> {
        for _ in 0..1000 {
            let tids = self.task_ids()?;
            let new: Vec<i32> = tids
                .iter()
                .copied()
                .filter(|t| !self.threads.contains_key(t))
                .collect();
            if new.is_empty() {
                return Ok(self.threads.keys().copied().collect());
            }
            for t in new {
                self.stop(t)?;
            }
        }
        Err(AttachError::ThreadsKeepComing)
    }

    fn task_ids(&self) -> Result<Vec<i32>, AttachError> {
        let pid = self.pid;
        let dir = std::fs::read_dir(format!("/proc/{pid}/task"))
            .map_err(|error| AttachError::ListThreads { pid, error })?;
        Ok(dir
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
            .collect())
    }

    /// The ids of the stopped threads.
    pub fn stopped(&self) -> Vec<i32> {
        self.threads.keys().copied().collect()
    }

    /// Lets thread `tid` go (restoring nothing), passing on the signal it stopped with.
    pub fn release(&mut self, tid: i32) {
        if let Some(s) = self.threads.remove(&tid) {
            let _ = ptrace::detach(Pid::from_raw(tid), s.pending);
        }
    }

    /// Lets every thread go.
    pub fn release_all(&mut self) {
        for tid in self.stopped() {
            self.release(tid);
        }
    }

    /// Reads `len` bytes at `addr`.
    pub fn read(&self, addr: u64, len: usize) -> Result<Vec<u8>, AttachError> {
        let mut buf = vec![0; len];
        self.mem
            .read_exact_at(&mut buf, addr)
            .map_err(|error| AttachError::ReadMemory { addr, len, error })?;
        Ok(buf)
    }

    /// Writes `bytes` at `addr` (read-only code pages included: the kernel writes them for a
    /// tracer).
    pub fn write(&self, addr: u64, bytes: &[u8]) -> Result<(), AttachError> {
        self.mem
            .write_all_at(bytes, addr)
            .map_err(|error| AttachError::WriteMemory {
                addr,
                len: bytes.len(),
                error,
            })
    }

    /// The instruction pointer of stopped thread `tid`.
    pub fn rip(&self, tid: i32) -> Result<u64, AttachError> {
        ptrace::getregs(Pid::from_raw(tid))
            .map(|r| r.rip)
            .map_err(failed("PTRACE_GETREGS", tid))
    }

    /// Executes one instruction of stopped thread `tid`.
    pub fn step(&mut self, tid: i32) -> Result<(), AttachError> {
        let t = Pid::from_raw(tid);
        ptrace::step(t, None).map_err(failed("PTRACE_SINGLESTEP", tid))?;
        loop {
            match waitpid(t, Some(WaitPidFlag::__WALL)) {
                Ok(WaitStatus::Stopped(_, Signal::SIGTRAP)) => return Ok(()),
                Ok(WaitStatus::Stopped(_, sig)) => {
                    // A signal came first: keep it for the release, step again.
                    if let Some(s) = self.threads.get_mut(&tid) {
                        s.pending = Some(sig);
                    }
                    ptrace::step(t, None).map_err(failed("PTRACE_SINGLESTEP", tid))?;
                }
                Ok(WaitStatus::Exited(..) | WaitStatus::Signaled(..)) => {
                    self.threads.remove(&tid);
                    return Err(AttachError::Exited {
                        tid,
                        during: "while being single-stepped",
                    });
                }
                Ok(_) | Err(Errno::EINTR) => continue,
                Err(e) => return Err(wait_failed(tid, "to single-step", e)),
            }
        }
    }

    /// Saves the registers and extended state of stopped thread `tid`.
    pub fn save(&self, tid: i32) -> Result<SavedRegs, AttachError> {
        let t = Pid::from_raw(tid);
        let regs = ptrace::getregs(t).map_err(failed("PTRACE_GETREGS", tid))?;
        let mut xstate = vec![0u8; 1 << 16];
        let len = xstate_regset(
            libc::PTRACE_GETREGSET,
            "PTRACE_GETREGSET(NT_X86_XSTATE)",
            tid,
            &mut xstate,
        )?;
        xstate.truncate(len);
        Ok(SavedRegs { regs, xstate })
    }

    /// Puts back what [`Tracer::save`] saved.
    pub fn restore(&self, tid: i32, saved: &SavedRegs) -> Result<(), AttachError> {
        let t = Pid::from_raw(tid);
        ptrace::setregs(t, saved.regs).map_err(failed("PTRACE_SETREGS", tid))?;
        // The very bytes GETREGSET filled (the kernel does not write through a SETREGSET).
        let mut xstate = saved.xstate.clone();
        xstate_regset(
            libc::PTRACE_SETREGSET,
            "PTRACE_SETREGSET(NT_X86_XSTATE)",
            tid,
            &mut xstate,
        )?;
        Ok(())
    }

    /// Calls `func(args…)` (at most six integer arguments) on stopped thread `tid`, whose
    /// registers the caller has saved and will restore; `data` is copied below the thread's
    /// stack first and its address is handed to `args_of`, which gives the arguments. Returns
    /// `rax`.
    ///
    /// The call returns to `landing`: [`LANDING`] placed in the target, which parks the thread
    /// in `pause()` with the result in `rdi`, so that a tracer that dies mid-call leaves a
    /// thread that sleeps instead of one that faults (the watchdog takes it from there). The
    /// thread runs under `PTRACE_SYSCALL` until it enters that `pause`, then is stopped the way
    /// [`Tracer::stop`] stops it. With `landing` 0 (the first call, before there is a page to
    /// land in) it returns to address 0 and the fault is the signal, never delivered.
    #[allow(clippy::too_many_arguments)]
    pub fn call(
        &mut self,
        tid: i32,
        saved: &SavedRegs,
        func: u64,
        data: &[u8],
        args_of: impl FnOnce(u64) -> Vec<u64>,
        landing: u64,
        limit: Duration,
    ) -> Result<u64, AttachError> {
        let t = Pid::from_raw(tid);
        let mut r = saved.regs;
        // Below the red zone (128 bytes) and the data, 16-byte aligned, then the return
        // address: at the callee's first instruction rsp + 8 is 16-byte aligned.
        let data_at = (r.rsp - 128 - data.len() as u64 - 64) & !0xf;
        if !data.is_empty() {
            self.write(data_at, data)?;
        }
        let sp = ((data_at - 256) & !0xf) - 8;
        self.write(sp, &landing.to_le_bytes())?;
        let args = args_of(data_at);
        let slots = [
            &mut r.rdi, &mut r.rsi, &mut r.rdx, &mut r.rcx, &mut r.r8, &mut r.r9,
        ];
        for (slot, v) in slots.into_iter().zip(args) {
            *slot = v;
        }
        r.rsp = sp;
        r.rip = func;
        r.rax = 0;
        // Not in a system call: the kernel must not restart one with these registers.
        r.orig_rax = u64::MAX;
        ptrace::setregs(t, r).map_err(failed("PTRACE_SETREGS", tid))?;
        let resume = |sig: Option<Signal>| {
            if landing == 0 {
                ptrace::cont(t, sig).map_err(failed("PTRACE_CONT", tid))
            } else {
                ptrace::syscall(t, sig).map_err(failed("PTRACE_SYSCALL", tid))
            }
        };
        resume(None)?;
        let start = Instant::now();
        loop {
            match waitpid(t, Some(WaitPidFlag::__WALL | WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::StillAlive) => {
                    if start.elapsed() > limit {
                        // Stopped again, mid-call: what it holds stays held, so the error
                        // says so rather than pretending the undo is clean.
                        let _ = ptrace::interrupt(t);
                        let _ = waitpid(t, Some(WaitPidFlag::__WALL));
                        return Err(AttachError::CallTimeout { limit });
                    }
                    idle(start);
                }
                Ok(WaitStatus::PtraceSyscall(_)) => {
                    let now = ptrace::getregs(t).map_err(failed("PTRACE_GETREGS", tid))?;
                    if landing != 0
                        && now.orig_rax == libc::SYS_pause as u64
                        && (landing..landing + LANDING.len() as u64).contains(&now.rip)
                    {
                        let result = now.rdi;
                        self.park(tid)?;
                        return Ok(result);
                    }
                    resume(None)?;
                }
                Ok(WaitStatus::Stopped(_, Signal::SIGSEGV)) => {
                    let now = ptrace::getregs(t).map_err(failed("PTRACE_GETREGS", tid))?;
                    if now.rip == 0 && landing == 0 {
                        return Ok(now.rax);
                    }
                    return Err(AttachError::CallFaulted { rip: now.rip });
                }
                Ok(WaitStatus::Stopped(_, sig)) => {
                    // A signal of the program's own: let its handler run now, as it would have.
                    resume(Some(sig))?;
                }
                Ok(WaitStatus::PtraceEvent(..)) => {
                    resume(None)?;
                }
                Ok(WaitStatus::Exited(..) | WaitStatus::Signaled(..)) => {
                    self.threads.remove(&tid);
                    return Err(AttachError::Exited {
                        tid,
                        during: "during a call into it",
                    });
                }
                Ok(_) | Err(Errno::EINTR) => continue,
                Err(e) => return Err(wait_failed(tid, "during a call into it", e)),
            }
        }
    }

    /// A thread at the entry of the landing's `pause`: lets it enter the call and stops it
    /// there with `PTRACE_INTERRUPT`, the same kind of stop as [`Tracer::stop`]'s, so that the
    /// registers saved at that first stop can be put back as they were.
    fn park(&mut self, tid: i32) -> Result<(), AttachError> {
        let t = Pid::from_raw(tid);
        ptrace::cont(t, None).map_err(failed("PTRACE_CONT", tid))?;
        ptrace::interrupt(t).map_err(failed("PTRACE_INTERRUPT", tid))?;
        loop {
            match waitpid(t, Some(WaitPidFlag::__WALL)) {
                Ok(WaitStatus::PtraceEvent(..)) => return Ok(()),
                Ok(WaitStatus::PtraceSyscall(_)) => {
                    // The exit of a pause cut short: stop it again at the next signal check.
                    ptrace::cont(t, None).map_err(failed("PTRACE_CONT", tid))?;
                }
                Ok(WaitStatus::Stopped(_, sig)) => {
                    if let Some(s) = self.threads.get_mut(&tid) {
                        s.pending = Some(sig);
                    }
                    return Ok(());
                }
                Ok(WaitStatus::Exited(..) | WaitStatus::Signaled(..)) => {
                    self.threads.remove(&tid);
                    return Err(AttachError::Exited {
                        tid,
                        during: "during a call into it",
                    });
                }
                Ok(_) | Err(Errno::EINTR) => continue,
                Err(e) => return Err(wait_failed(tid, "to stop after a call", e)),
            }
        }
    }

    /// Whether stopped thread `tid` is parked in the landing at `landing` (waiting in its
    /// `pause`, a call finished).
    pub fn in_landing(&self, tid: i32, landing: u64) -> bool {
        landing != 0
            && ptrace::getregs(Pid::from_raw(tid))
                .is_ok_and(|r| (landing..landing + LANDING.len() as u64 + 2).contains(&r.rip))
    }

    /// Runs stopped thread `tid` (whose tracer died during a call) until it enters the
    /// landing's `pause`, then stops it there: the call has finished. False if it did not
    /// within `limit` (it was not in a call after all); it is stopped again either way.
    pub fn finish_call(
        &mut self,
        tid: i32,
        landing: u64,
        limit: Duration,
    ) -> Result<bool, AttachError> {
        if self.in_landing(tid, landing) {
            return Ok(true);
        }
        let t = Pid::from_raw(tid);
        let syscall = |sig| ptrace::syscall(t, sig).map_err(failed("PTRACE_SYSCALL", tid));
        syscall(None)?;
        let start = Instant::now();
        loop {
            match waitpid(t, Some(WaitPidFlag::__WALL | WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::StillAlive) => {
                    if start.elapsed() > limit {
                        ptrace::interrupt(t).map_err(failed("PTRACE_INTERRUPT", tid))?;
                        let _ = waitpid(t, Some(WaitPidFlag::__WALL));
                        return Ok(false);
                    }
                    idle(start);
                }
                Ok(WaitStatus::PtraceSyscall(_)) => {
                    let now = ptrace::getregs(t).map_err(failed("PTRACE_GETREGS", tid))?;
                    if now.orig_rax == libc::SYS_pause as u64
                        && (landing..landing + LANDING.len() as u64).contains(&now.rip)
                    {
                        self.park(tid)?;
                        return Ok(true);
                    }
                    syscall(None)?;
                }
                Ok(WaitStatus::Stopped(_, sig)) => {
                    syscall(Some(sig))?;
                }
                Ok(WaitStatus::PtraceEvent(..)) => {
                    syscall(None)?;
                }
                Ok(WaitStatus::Exited(..) | WaitStatus::Signaled(..)) => {
                    self.threads.remove(&tid);
                    return Err(AttachError::Exited {
                        tid,
                        during: "while finishing a call",
                    });
                }
                Ok(_) | Err(Errno::EINTR) => continue,
                Err(e) => return Err(wait_failed(tid, "to finish a call", e)),
            }
        }
    }
}

/// Between two polls of a thread that runs: yield for the first few milliseconds (a call
/// into the target stops at every system call, and each stop should be answered at once: the
/// target's pause is their sum), then sleep.
fn idle(since: Instant) {
    if since.elapsed() < Duration::from_millis(20) {
        std::thread::yield_now();
    } else {
        std::thread::sleep(Duration::from_micros(100));
    }
}

/// Where a call into the target returns: `mov rdi, rax`, then forever `mov eax, SYS_pause;
/// syscall`. The thread sleeps there with the result in `rdi` until its tracer takes it back.
pub const LANDING: [u8; 12] = [
    0x48, 0x89, 0xc7, // mov rdi, rax
    0xb8, 0x22, 0x00, 0x00, 0x00, // mov eax, 34 (pause)
    0x0f, 0x05, // syscall
    0xeb, 0xf7, // jmp back to mov eax
];

impl Drop for Tracer {
    fn drop(&mut self) {
        self.release_all();
    }
}
