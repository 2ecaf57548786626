//! The process-wide driver behind one mutex, each thread's context stack,
//! and a count of calls per entry point.

use std::cell::RefCell;
use std::collections::BTreeMap;
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

thread_local! {
    /// The calling thread's context stack; the current context is the last.
    static STACK: RefCell<ContextStack> = const { RefCell::new(Vec::new()) };
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
    lock().calls.get(api).copied().unwrap_or(0)
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
