//! The clock every record carries: `CLOCK_MONOTONIC` in nanoseconds, read from the time-stamp
//! counter where that is safe.
//!
//! `clock_gettime` through the vDSO costs about 30–40 ns on the bench machine, a large share of
//! a hook's cost; `rdtsc` about 10 ns. Where the processor's TSC is invariant (CPUID
//! `0x8000_0007`, EDX bit 8: it ticks at one rate in every power state) and the kernel itself
//! keeps time with it (its clock source is `tsc`, so the TSC is synchronised across CPUs),
//! [`now_ns`] converts `rdtsc` to `CLOCK_MONOTONIC` nanoseconds:
//!
//! - Each thread keeps an anchor: a `clock_gettime` reading and the TSC at that moment (the
//!   midpoint of a read before and one after). A reading within [`REFRESH_NS`] of TSC time
//!   after the anchor is `anchor_ns + ticks × scale`; past that (or if the TSC went backwards),
//!   the thread takes a new anchor and returns the real clock. So every time is at most a
//!   few milliseconds of extrapolation away from a real `CLOCK_MONOTONIC` reading.
//! - The scale (nanoseconds per tick, 32.32 fixed point) is process-wide and measured, not
//!   read from the processor: the span from the process's first anchor to the latest one,
//!   over the ticks between them. It is known once that span reaches [`CALIBRATE_NS`]
//!   (until then every reading is a real `clock_gettime`) and grows more exact with every
//!   anchor any thread takes: a 30 ns pairing error over 1 ms is 3·10⁻⁵, i.e. 60 ns over a
//!   2 ms extrapolation, and after a second of recording it is below a nanosecond. A rate
//!   the kernel slews (NTP, at most 500 ppm) moves a time by at most 1 µs over 2 ms.
//! - Per thread, times never go back: a reading below the thread's last is the last.
//! - Times stay comparable across processes of one boot: each is a `CLOCK_MONOTONIC` reading
//!   or an extrapolation from one, within the errors above.
//!
//! Without an invariant TSC, on a kernel that does not use it, or on another architecture,
//! every reading is `clock_gettime(CLOCK_MONOTONIC)`.

use core::cell::Cell;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};

/// Longest extrapolation from a thread's anchor, in nanoseconds of TSC time.
pub(crate) const REFRESH_NS: u64 = 2_000_000;
/// Shortest span between the process's first anchor and a later one that sets the scale.
pub(crate) const CALIBRATE_NS: u64 = 1_000_000;

const UNKNOWN: u8 = 0;
const TSC: u8 = 1;
const SYSCALL: u8 = 2;

/// Which clock [`now_ns`] reads ([`TSC`] or [`SYSCALL`]; [`UNKNOWN`] before the first call).
static MODE: AtomicU8 = AtomicU8::new(UNKNOWN);
/// The process's first anchor: TSC and nanoseconds (0: none yet).
static BASE_TSC: AtomicU64 = AtomicU64::new(0);
static BASE_NS: AtomicU64 = AtomicU64::new(0);
/// Nanoseconds per tick, 32.32 fixed point (0: not calibrated yet).
static SCALE: AtomicU64 = AtomicU64::new(0);
/// [`REFRESH_NS`] in ticks at [`SCALE`] (0: not calibrated yet).
static REFRESH_TICKS: AtomicU64 = AtomicU64::new(0);

/// A thread's anchor and its last reading.
#[derive(Clone, Copy)]
struct Anchor {
    tsc: u64,
    ns: u64,
    last: u64,
}

thread_local! {
    static ANCHOR: Cell<Anchor> = const { Cell::new(Anchor { tsc: 0, ns: 0, last: 0 }) };
}

/// `CLOCK_MONOTONIC` now, in nanoseconds; never below this thread's previous reading.
#[inline]
pub(crate) fn now_ns() -> u64 {
    match MODE.load(Ordering::Relaxed) {
        TSC => tsc_ns(),
        SYSCALL => syscall_ns(),
        _ => {
            choose();
            now_ns()
        }
    }
}

/// This thread's last [`now_ns`] reading, or the clock now if it has none.
pub(crate) fn last_ns() -> u64 {
    match ANCHOR.try_with(Cell::get) {
        Ok(a) if a.last != 0 => a.last,
        _ => now_ns(),
    }
}

/// True when [`now_ns`] reads the TSC (after its first call).
#[cfg(test)]
pub(crate) fn uses_tsc() -> bool {
    MODE.load(Ordering::Relaxed) == TSC
}

/// `clock_gettime` of `clock`, in nanoseconds.
pub(crate) fn clock_ns(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // Safety: valid clock id and out-pointer.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// The fallback: `clock_gettime`, kept monotonic per thread like the TSC path.
fn syscall_ns() -> u64 {
    let t = clock_ns(libc::CLOCK_MONOTONIC);
    ANCHOR
        .try_with(|c| {
            let mut a = c.get();
            let t = t.max(a.last);
            a.last = t;
            c.set(a);
            t
        })
        .unwrap_or(t)
}

#[cfg(target_arch = "x86_64")]
#[inline]
fn rdtsc() -> u64 {
    // Safety: rdtsc is available on every x86-64 processor and has no preconditions.
    unsafe { core::arch::x86_64::_rdtsc() }
}

#[cfg(not(target_arch = "x86_64"))]
fn rdtsc() -> u64 {
    0
}

#[inline]
fn tsc_ns() -> u64 {
    let tsc = rdtsc();
    ANCHOR
        .try_with(|c| {
            let mut a = c.get();
            let ticks = tsc.wrapping_sub(a.tsc);
            // A TSC below the anchor wraps to a huge count and takes a new anchor too.
            let t = if a.tsc != 0 && ticks < REFRESH_TICKS.load(Ordering::Relaxed) {
                let scale = SCALE.load(Ordering::Relaxed);
                a.ns + ((ticks as u128 * scale as u128) >> 32) as u64
            } else {
                let (tsc, ns) = anchor();
                a.tsc = tsc;
                a.ns = ns;
                ns
            };
            let t = t.max(a.last);
            a.last = t;
            c.set(a);
            t
        })
        // Thread-local storage torn down (thread exit): the real clock.
        .unwrap_or_else(|_| clock_ns(libc::CLOCK_MONOTONIC))
}

/// Anchors taken (tests check that most readings are extrapolated).
#[cfg(test)]
static ANCHORS: AtomicU64 = AtomicU64::new(0);

/// A new anchor (TSC, nanoseconds), folded into the process's scale.
#[cold]
fn anchor() -> (u64, u64) {
    #[cfg(test)]
    ANCHORS.fetch_add(1, Ordering::Relaxed);
    // The TSC at the clock reading is taken as the midpoint of one read before and one after;
    // a pair stretched by preemption is taken again (a few times at most).
    let mut best = (0, 0, u64::MAX);
    for _ in 0..3 {
        let before = rdtsc();
        let ns = clock_ns(libc::CLOCK_MONOTONIC);
        let after = rdtsc();
        let width = after.wrapping_sub(before);
        if width < best.2 {
            best = (before + width / 2, ns, width);
        }
        if width < 2_000 {
            break;
        }
    }
    let (tsc, ns, _) = best;
    calibrate(tsc, ns);
    (tsc, ns)
}

/// Refines the process's scale with a new anchor: the span from the first anchor to this one.
fn calibrate(tsc: u64, ns: u64) {
    if BASE_TSC
        .compare_exchange(0, tsc, Ordering::AcqRel, Ordering::Acquire)
        .is_ok()
    {
        BASE_NS.store(ns, Ordering::Release);
        return;
    }
    let (base_tsc, base_ns) = (
        BASE_TSC.load(Ordering::Acquire),
        BASE_NS.load(Ordering::Acquire),
    );
    if base_ns == 0 || ns < base_ns + CALIBRATE_NS || tsc <= base_tsc {
        return;
    }
    let scale = (((ns - base_ns) as u128) << 32) / (tsc - base_tsc) as u128;
    if scale == 0 || scale > u64::MAX as u128 {
        return;
    }
    let refresh = ((REFRESH_NS as u128) << 32) / scale;
    SCALE.store(scale as u64, Ordering::Relaxed);
    REFRESH_TICKS.store(refresh.min(u64::MAX as u128) as u64, Ordering::Relaxed);
}

/// Decides once per process which clock to read.
#[cold]
fn choose() {
    let mode = if invariant_tsc() && kernel_uses_tsc() {
        TSC
    } else {
        SYSCALL
    };
    let _ = MODE.compare_exchange(UNKNOWN, mode, Ordering::AcqRel, Ordering::Acquire);
}

/// CPUID says the TSC is invariant.
#[cfg(target_arch = "x86_64")]
fn invariant_tsc() -> bool {
    use core::arch::x86_64::__cpuid;
    // Leaf 0x8000_0000 gives the highest extended leaf; 0x8000_0007 is only asked for when it
    // exists.
    __cpuid(0x8000_0000).eax >= 0x8000_0007 && __cpuid(0x8000_0007).edx & (1 << 8) != 0
}

#[cfg(not(target_arch = "x86_64"))]
fn invariant_tsc() -> bool {
    false
}

/// The kernel keeps time with the TSC (so it found it synchronised across CPUs).
fn kernel_uses_tsc() -> bool {
    let path = c"/sys/devices/system/clocksource/clocksource0/current_clocksource";
    // Safety: a valid C string and plain flags.
    let fd = unsafe { libc::open(path.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) };
    if fd < 0 {
        return false;
    }
    let mut buf = [0u8; 32];
    // Safety: reads into a buffer of the length given; the descriptor is ours.
    let n = unsafe { libc::read(fd, buf.as_mut_ptr() as *mut libc::c_void, buf.len()) };
    // Safety: closes the descriptor opened above.
    unsafe { libc::close(fd) };
    n > 0 && buf[..n as usize].trim_ascii_end() == b"tsc"
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Per thread, times never go back, and each lies within 1 µs of the `clock_gettime`
    /// readings taken just before and after it, through calibration and many refreshes.
    #[test]
    fn monotonic_per_thread_and_close_to_clock_gettime() {
        let threads: Vec<_> = (0..4)
            .map(|_| {
                std::thread::spawn(|| {
                    let start = clock_ns(libc::CLOCK_MONOTONIC);
                    let (mut last, mut n, mut worst) = (0u64, 0u64, 0i64);
                    while clock_ns(libc::CLOCK_MONOTONIC) - start < 60_000_000 {
                        let before = clock_ns(libc::CLOCK_MONOTONIC);
                        let t = now_ns();
                        let after = clock_ns(libc::CLOCK_MONOTONIC);
                        assert!(t >= last, "went back: {last} then {t}");
                        let off = if t < before {
                            before as i64 - t as i64
                        } else if t > after {
                            t as i64 - after as i64
                        } else {
                            0
                        };
                        worst = worst.max(off);
                        last = t;
                        n += 1;
                        // Let time pass between readings too, not only between refreshes.
                        if n.is_multiple_of(1024) {
                            std::thread::sleep(std::time::Duration::from_micros(50));
                        }
                    }
                    (n, worst)
                })
            })
            .collect();
        let mut readings = 0;
        for t in threads {
            let (n, worst) = t.join().unwrap();
            assert!(n > 10_000, "{n} readings");
            eprintln!("{n} readings, at most {worst} ns outside the clock_gettime pair");
            assert!(worst <= 1_000, "{worst} ns from clock_gettime");
            readings += n;
        }
        if invariant_tsc() && kernel_uses_tsc() {
            assert!(uses_tsc());
            assert_ne!(SCALE.load(Ordering::Relaxed), 0, "calibrated");
            let anchors = ANCHORS.load(Ordering::Relaxed);
            assert!(
                anchors * 10 < readings,
                "{anchors} anchors for {readings} readings: mostly extrapolated"
            );
        }
    }

    #[test]
    fn fallback_is_monotonic() {
        let mut last = 0;
        for _ in 0..100_000 {
            let t = syscall_ns();
            assert!(t >= last);
            last = t;
        }
    }
}
