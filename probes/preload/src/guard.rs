//! The per-thread re-entrancy guard.
//!
//! A hook records only if it could take its thread's guard. The guard is held for the whole
//! hook (the real call included), so a driver, or another interposer under us, that calls a
//! hooked entry point from inside a hooked call is passed straight through instead of being
//! recorded twice or recursing into the recorder. Repeated calls are not recursion: the guard
//! is released in `Drop` when the outer hook returns.

use std::cell::Cell;
use std::marker::PhantomData;

thread_local! {
    // `const` initialisation and no destructor: reading it never allocates, never registers a
    // TLS destructor and works during thread teardown.
    static IN_HOOK: Cell<bool> = const { Cell::new(false) };
}

/// Proof that this thread is inside a recording hook; releases the thread on drop.
pub(crate) struct ReentrancyGuard {
    // Tied to the thread that took it.
    _not_send: PhantomData<*const ()>,
}

impl ReentrancyGuard {
    /// Takes the thread's guard, or `None` if this thread already holds it.
    pub(crate) fn acquire() -> Option<ReentrancyGuard> {
        IN_HOOK
            .try_with(|busy| {
                if busy.get() {
                    None
                } else {
                    busy.set(true);
                    Some(ReentrancyGuard {
                        _not_send: PhantomData,
                    })
                }
            })
            .ok()
            .flatten()
    }

    /// Clears the calling thread's flag: the only thread of a child after `fork`.
    pub(crate) fn reset_after_fork() {
        let _ = IN_HOOK.try_with(|busy| busy.set(false));
    }
}

impl Drop for ReentrancyGuard {
    fn drop(&mut self) {
        let _ = IN_HOOK.try_with(|busy| busy.set(false));
    }
}
