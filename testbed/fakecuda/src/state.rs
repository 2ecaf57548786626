//! The process-wide driver behind one mutex, each thread's context stack,
//! and a count of calls per entry point.
//!
//! As in the real driver, the current context is the calling thread's own:
//! `cuCtxGetCurrent` and `cuCtxGetDevice` read it without the process-wide
//! lock ([`current_context`], [`current_device`]). The device of the current
//! context is remembered per thread once checked under the lock, together
//! with the driver's context generation ([`crate::driver::context_generation`]), which moves whenever a context may have
//! stopped being valid (destroyed, a primary context's last release, a reset):
//! a thread then checks again under the lock, and gets the same error it
//! would have got there.

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

use crate::config;
use crate::driver::{ContextStack, Driver};
use crate::result::*;

struct State {
    /// `None` until the first successful `cuInit`.
    driver: Option<Driver>,
    /// Calls per exported function, by the function's own name.
    calls: BTreeMap<&'static str, u64>,
}

static STATE: Mutex<State> = Mutex::new(State {
    driver: None,
    calls: BTreeMap::new(),
});

/// Set by the first successful `cuInit` (which cannot be undone).
static INITIALISED: AtomicBool = AtomicBool::new(false);
/// Calls answered without the lock, by entry point, added to [`calls`].
static UNLOCKED_CALLS: [(&str, AtomicU64); 2] = [
    ("cuCtxGetCurrent", AtomicU64::new(0)),
    ("cuCtxGetDevice", AtomicU64::new(0)),
];

/// A thread's current context and its device, as last checked under the lock.
#[derive(Clone, Copy)]
struct Checked {
    /// The driver's context generation when checked; 0: nothing checked.
    generation: u64,
    context: u64,
    device: usize,
}

thread_local! {
    /// The calling thread's context stack; the current context is the last.
    static STACK: RefCell<ContextStack> = const { RefCell::new(Vec::new()) };
    static CHECKED: Cell<Checked> =
        const { Cell::new(Checked { generation: 0, context: 0, device: 0 }) };
}

fn count_unlocked(api: usize) {
    UNLOCKED_CALLS[api].1.fetch_add(1, Ordering::Relaxed);
}

/// The calling thread's context stack's top (0: none), without the lock. `None` before
/// `cuInit` or when the thread's stack is gone or busy.
fn stack_top() -> Option<u64> {
    if !INITIALISED.load(Ordering::Acquire) {
        return None;
    }
    STACK
        .try_with(|s| s.try_borrow().ok().map(|s| s.last().copied().unwrap_or(0)))
        .ok()
        .flatten()
}

/// `cuCtxGetCurrent` without the lock: the top of this thread's stack (0: none), or `None`
/// when only the locked path can answer (before `cuInit`).
pub(crate) fn current_context() -> Option<u64> {
    let top = stack_top()?;
    count_unlocked(0);
    Some(top)
}

/// `cuCtxGetDevice` without the lock: the current context's device if it was checked under
/// the lock since the last change to any context; `None` otherwise (then call
/// [`checked_current`] under the lock).
pub(crate) fn current_device() -> Option<usize> {
    let top = stack_top()?;
    let c = CHECKED.try_with(Cell::get).ok()?;
    if top == 0 || c.context != top || c.generation != crate::driver::context_generation() {
        return None;
    }
    count_unlocked(1);
    Some(c.device)
}

/// `Driver::current` under the lock, remembered for [`current_device`].
pub(crate) fn checked_current(d: &Driver, stack: &ContextStack) -> Res<(u64, usize)> {
    let (context, device) = d.current(stack)?;
    let _ = CHECKED.try_with(|c| {
        c.set(Checked {
            generation: crate::driver::context_generation(),
            context,
            device,
        })
    });
    Ok((context, device))
}

/// The state, even if a thread panicked while holding it: bookkeeping stays
/// usable, and no panic may cross the C boundary.
fn lock() -> MutexGuard<'static, State> {
    STATE.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Counts a call of `api` that works without an initialised driver.
pub(crate) fn count(api: &'static str) {
    *lock().calls.entry(api).or_insert(0) += 1;
}

/// How often `api` has been called in this process.
pub(crate) fn calls(api: &str) -> u64 {
    let unlocked: u64 = UNLOCKED_CALLS
        .iter()
        .filter(|(name, _)| *name == api)
        .map(|(_, n)| n.load(Ordering::Relaxed))
        .sum();
    lock().calls.get(api).copied().unwrap_or(0) + unlocked
}

/// `cuInit`: reads the configuration on first use and creates the driver.
pub(crate) fn init(flags: u32) -> CUresult {
    let mut state = lock();
    *state.calls.entry("cuInit").or_insert(0) += 1;
    if flags != 0 {
        return CUDA_ERROR_INVALID_VALUE;
    }
    let Ok(config) = config::get() else {
        return CUDA_ERROR_INVALID_VALUE;
    };
    if config.devices.is_empty() {
        return CUDA_ERROR_NO_DEVICE;
    }
    state.driver.get_or_insert_with(|| Driver::new(config));
    INITIALISED.store(true, Ordering::Release);
    CUDA_SUCCESS
}

/// Runs `f` with the driver and the calling thread's context stack, counting
/// the call as `api`. Before `cuInit`: `CUDA_ERROR_NOT_INITIALIZED`.
pub(crate) fn with_driver(
    api: &'static str,
    f: impl FnOnce(&mut Driver, &mut ContextStack) -> Res<()>,
) -> CUresult {
    let mut state = lock();
    *state.calls.entry(api).or_insert(0) += 1;
    let Some(driver) = state.driver.as_mut() else {
        return CUDA_ERROR_NOT_INITIALIZED;
    };
    let mut f = Some(f);
    let ran = STACK.try_with(|stack| match (stack.try_borrow_mut(), f.take()) {
        (Ok(mut stack), Some(f)) => f(driver, &mut stack),
        _ => Err(CUDA_ERROR_UNKNOWN),
    });
    match (ran, f) {
        (Ok(result), _) => code(result),
        // The thread is exiting and its stack is gone (a CUDA call from a
        // thread-local destructor): it has no current context any more.
        (Err(_), Some(f)) => code(f(driver, &mut Vec::new())),
        (Err(_), None) => CUDA_ERROR_UNKNOWN,
    }
}
