//! Fork handling, module by module: each module that keeps per-process state which a child
//! made by `fork` must forget (the trace file, the strings and stacks already written, the
//! devices already described, locks whose holder does not exist in the child) registers its
//! own child handler with `pthread_atfork`, before it first writes that state.
//!
//! Handlers run in the child, which has one thread, and only touch atomics and the calling
//! thread's TLS. Each is idempotent: two threads racing through [`ForkHandler::register`] may
//! both register it, which is harmless, and no state is ever written before its handler is
//! registered.

use std::sync::atomic::{AtomicBool, Ordering};

/// A child handler, registered at most a few times (see the module docs).
pub(crate) struct ForkHandler {
    registered: AtomicBool,
    child: extern "C" fn(),
}

impl ForkHandler {
    /// A handler that runs `child` in every child made by `fork` once registered.
    pub(crate) const fn new(child: extern "C" fn()) -> ForkHandler {
        ForkHandler {
            registered: AtomicBool::new(false),
            child,
        }
    }

    /// Registers the handler unless that is done already: one load after the first call.
    #[inline]
    pub(crate) fn register(&self) {
        if !self.registered.load(Ordering::Acquire) {
            self.register_now();
        }
    }

    #[cold]
    fn register_now(&self) {
        // Safety: registering a child handler that only touches atomics and this thread's TLS.
        unsafe { libc::pthread_atfork(None, None, Some(self.child)) };
        self.registered.store(true, Ordering::Release);
    }
}
