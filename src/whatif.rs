//! What-if replay: the recorded driver-level allocation sequence set against a smaller card.
//!
//! Every process's physical device allocations are replayed in time order and summed per device
//! ordinal, as they would share one card. An allocation would fail when the bytes live on its
//! device, plus itself, plus what stays resident outside the trace (the CUDA context, modules,
//! other programs), exceed the capacity. The first such allocation is where the program would
//! have stopped; later ones are counted, since a program that survives a refusal (a caching
//! allocator that frees its cache and retries) would meet them too.
//!
//! The driver hands out device memory in pages: with [`WhatIfOptions::granularity`] each
//! allocation of a page or more counts as its size rounded up to whole pages (2 MiB on the H200: an uncapped prefill
//! replayed against 18 GiB then fails on the same request as the same prefill run with an
//! 18 GiB limit, where requested sizes alone fit one chunk more). What is not modelled: a caching
//! allocator's reaction to the refusal.

use std::ops::ControlFlow;

use serde::Serialize;

use crate::error::Error;
use crate::replay::{Pool, Replayer, Step};
use crate::trace::{Item, Trace};

/// The card to replay against.
#[derive(Debug, Clone, Copy)]
pub struct WhatIfOptions {
    /// Device memory of the card, per device.
    pub capacity: u64,
    /// Bytes held outside the trace on each device (context, modules, other processes).
    pub resident: u64,
    /// The driver's allocation granularity: each allocation counts as its size rounded up to a
    /// multiple of it (0 or 1: as requested).
    pub granularity: u64,
    /// About how many points of the headroom-over-time series to keep per device (the series is
    /// thinned to between this and twice this, keeping each span's highest live bytes).
    pub points: usize,
}

/// The first allocation that would not fit.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct WouldFail {
    /// Seconds since the trace began.
    pub t_s: f64,
    /// Index of the process in the trace.
    #[serde(skip)]
    pub process: usize,
    /// Its pid.
    pub pid: u32,
    /// The driver function.
    pub api: &'static str,
    /// Bytes requested.
    pub size: u64,
    /// The label (NVTX or annotation range) active on the thread, if any.
    pub label: Option<String>,
    /// Traced bytes live on the device just before it, across every process.
    pub live_before: u64,
    /// Bytes that were still free for it: capacity − resident − live (may be below its size).
    pub free_before: u64,
    /// Native stack id in its process (0: none).
    #[serde(skip)]
    pub stack: u32,
}

/// One device's replay.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct DeviceWhatIf {
    /// Device ordinal.
    pub device: i32,
    /// Highest traced bytes live at once (all processes together).
    pub peak_bytes: u64,
    /// When that was, seconds since the trace began.
    pub peak_t_s: f64,
    /// Capacity − resident − peak: below zero when the peak does not fit.
    pub min_headroom: i128,
    /// The first allocation that would fail, if any.
    pub first_failure: Option<WouldFail>,
    /// Allocations that would not fit, the first included.
    pub would_fail: u64,
    /// Traced bytes live over time: (seconds, the highest live bytes in the span starting then).
    pub live_over_time: Vec<(f64, u64)>,
}

/// The whole replay.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct WhatIf {
    /// The card's capacity.
    pub capacity: u64,
    /// Bytes assumed resident outside the trace.
    pub resident: u64,
    /// Devices in ordinal order.
    pub devices: Vec<DeviceWhatIf>,
}

/// A bounded series: the highest value per time span, spans doubling as the series fills.
#[derive(Debug, Clone)]
struct Series {
    span_ns: u64,
    points: Vec<(u64, u64)>,
    limit: usize,
}

impl Series {
    fn new(limit: usize) -> Series {
        Series {
            span_ns: 1_000_000,
            points: Vec::new(),
            limit: limit.max(2),
        }
    }

    fn record(&mut self, t_ns: u64, live: u64) {
        let start = t_ns - t_ns % self.span_ns;
        match self.points.last_mut() {
            Some((s, v)) if *s == start => *v = (*v).max(live),
            _ => self.points.push((start, live)),
        }
        if self.points.len() > 2 * self.limit {
            self.span_ns *= 2;
            let span = self.span_ns;
            let mut merged: Vec<(u64, u64)> = Vec::with_capacity(self.points.len() / 2 + 1);
            for &(s, v) in &self.points {
                let s = s - s % span;
                match merged.last_mut() {
                    Some((ms, mv)) if *ms == s => *mv = (*mv).max(v),
                    _ => merged.push((s, v)),
                }
            }
            self.points = merged;
        }
    }
}

#[derive(Debug)]
struct DeviceState {
    live: u64,
    peak: u64,
    peak_t_ns: u64,
    first: Option<WouldFail>,
    would_fail: u64,
    series: Series,
}

/// Replays `trace` against the card `opts` describes.
pub fn what_if(trace: &Trace, opts: WhatIfOptions) -> Result<WhatIf, Error> {
    let start = trace.start_ns();
    let budget = opts.capacity.saturating_sub(opts.resident);
    let mut devices: std::collections::BTreeMap<i32, DeviceState> = Default::default();
    let mut replay = Replayer::new();
    let mut seq = 0usize;
    let secs = |t_ns: u64| t_ns.saturating_sub(start) as f64 / 1e9;
    trace.for_each_item(|pi, item| {
        let Item::Event(e) = item else {
            return ControlFlow::Continue(());
        };
        let s = seq;
        seq += 1;
        match replay.apply(pi, s, &e) {
            Step::Allocated { pool: Pool::Device } => {
                let d = devices
                    .entry(e.device)
                    .or_insert_with(|| DeviceState::new(opts.points));
                let size = rounded(e.size, opts.granularity);
                // Would it have fitted beside what was live then?
                if d.live.saturating_add(size) > budget {
                    d.would_fail += 1;
                    if d.first.is_none() {
                        d.first = Some(WouldFail {
                            t_s: secs(e.t_ns),
                            process: pi,
                            pid: trace.processes[pi].pid(),
                            api: e.api.name(),
                            size: e.size,
                            label: trace.processes[pi].string(e.label).map(str::to_owned),
                            live_before: d.live,
                            free_before: budget.saturating_sub(d.live),
                            stack: e.stack,
                        });
                    }
                }
                d.live = d.live.saturating_add(size);
                if d.live > d.peak {
                    d.peak = d.live;
                    d.peak_t_ns = e.t_ns;
                }
                d.series.record(e.t_ns.saturating_sub(start), d.live);
            }
            Step::Released { freed: Some(a), .. } if a.pool == Pool::Device => {
                if let Some(d) = devices.get_mut(&a.event.device) {
                    d.live = d.live.saturating_sub(rounded(a.size(), opts.granularity));
                    d.series.record(e.t_ns.saturating_sub(start), d.live);
                }
            }
            _ => {}
        }
        ControlFlow::Continue(())
    })?;
    let devices = devices
        .into_iter()
        .map(|(device, d)| DeviceWhatIf {
            device,
            peak_bytes: d.peak,
            peak_t_s: secs(d.peak_t_ns),
            min_headroom: budget as i128 - d.peak as i128,
            first_failure: d.first,
            would_fail: d.would_fail,
            live_over_time: d
                .series
                .points
                .iter()
                .map(|&(t, v)| (t as f64 / 1e9, v))
                .collect(),
        })
        .collect();
    Ok(WhatIf {
        capacity: opts.capacity,
        resident: opts.resident,
        devices,
    })
}

/// `size` rounded up to a multiple of `granularity` (saturating). Requests below one page are
/// taken as they are: the driver packs small allocations into shared pages.
fn rounded(size: u64, granularity: u64) -> u64 {
    if granularity <= 1 || size < granularity {
        return size;
    }
    size.div_ceil(granularity).saturating_mul(granularity)
}

impl DeviceState {
    fn new(points: usize) -> DeviceState {
        DeviceState {
            live: 0,
            peak: 0,
            peak_t_ns: 0,
            first: None,
            would_fail: 0,
            series: Series::new(points),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tests::{MIB, known_sequence, trace_of};

    fn replay(capacity: u64, resident: u64) -> DeviceWhatIf {
        let t = trace_of(1, known_sequence());
        let w = what_if(
            &t,
            WhatIfOptions {
                capacity,
                resident,
                granularity: 0,
                points: 4,
            },
        )
        .unwrap();
        // Host memory and reserved address space never count against the card.
        assert_eq!(w.devices.len(), 1);
        w.devices[0].clone()
    }

    #[test]
    fn a_card_with_room_reports_the_lowest_headroom() {
        let d = replay(64 * MIB, 0);
        assert_eq!(d.peak_bytes, 50 * MIB);
        assert_eq!(d.peak_t_s, 40e-9);
        assert_eq!(d.min_headroom, 14 * MIB as i128);
        assert_eq!(d.first_failure, None);
        assert_eq!(d.would_fail, 0);
    }

    #[test]
    fn the_first_allocation_over_the_card_is_named_with_what_was_live() {
        let d = replay(45 * MIB, 0);
        let f = d.first_failure.unwrap();
        assert_eq!((f.t_s, f.api, f.size), (40e-9, "cuMemAllocAsync", 30 * MIB));
        assert_eq!((f.live_before, f.free_before), (20 * MIB, 25 * MIB));
        assert_eq!(d.would_fail, 1);
        assert_eq!(d.min_headroom, -(5 * MIB as i128));
    }

    #[test]
    fn resident_bytes_take_from_the_card_and_later_misses_are_counted() {
        let d = replay(45 * MIB, 20 * MIB);
        let f = d.first_failure.unwrap();
        assert_eq!((f.t_s, f.size, f.live_before), (20e-9, 20 * MIB, 10 * MIB));
        assert_eq!(f.label, None);
        assert_eq!(d.would_fail, 2);
    }

    #[test]
    fn allocations_count_at_the_drivers_granularity() {
        assert_eq!(rounded(1, 2 * MIB), 1);
        assert_eq!(rounded(2 * MIB + 1, 2 * MIB), 4 * MIB);
        assert_eq!(rounded(2 * MIB, 2 * MIB), 2 * MIB);
        assert_eq!(rounded(u64::MAX, 2 * MIB), u64::MAX);
        let t = trace_of(1, known_sequence());
        let opts = WhatIfOptions {
            capacity: 64 * MIB,
            resident: 0,
            granularity: 16 * MIB,
            points: 4,
        };
        // 10, 20 and 30 MiB take 16, 32 and 32 MiB: the peak is 64 MiB, no headroom left.
        let d = what_if(&t, opts).unwrap().devices[0].clone();
        assert_eq!(d.peak_bytes, 64 * MIB);
        assert_eq!(d.min_headroom, 0);
    }

    #[test]
    fn the_series_keeps_each_span_maximum_within_its_bound() {
        let mut s = Series::new(4);
        for i in 0..10_000u64 {
            s.record(i * 1_000_000, i % 97);
        }
        assert!(s.points.len() <= 8, "{}", s.points.len());
        assert_eq!(s.points.iter().map(|p| p.1).max(), Some(96));
        assert!(s.points.windows(2).all(|w| w[0].0 < w[1].0));
    }
}
