//! The growth analysis on synthetic traces: a leak among steady traffic, a plateau, steady
//! traffic alone, and a tensor leak inside PyTorch's segments.

use vramtrace_format::{EventKind, MemKind, Record};

use super::*;
use crate::summary::{SummaryOptions, summarize};
use crate::tests::{MIB, ev, tensor_alloc, trace_of};

const MS: u64 = 1_000_000;

/// A program of `iterations` iterations, one every `step` ns: each allocates and frees a
/// scratch buffer (stack 1); every `leak_every`-th also allocates `leak` bytes at stack 2 it
/// never frees; a cache at stack 3 grows by `cache` bytes an iteration for the first
/// `cache_for` iterations. A 64 MiB buffer (stack 4) is allocated first.
fn program(iterations: u64, leak_every: u64, leak: u64, cache: u64, cache_for: u64) -> Vec<Record> {
    use EventKind::*;
    use MemKind::*;
    let step = 10 * MS;
    let mut r = Vec::new();
    let mut at = |t: u64, mut e: vramtrace_format::Event, stack: u32| {
        e.t_ns = t;
        e.stack = stack;
        r.push(Record::Event(e));
    };
    at(
        1,
        ev(0, Alloc, Device, "cuMemAlloc_v2", 0x10_0000_0000, 64 * MIB),
        4,
    );
    let mut next = 0x20_0000_0000u64;
    for i in 0..iterations {
        let t = 2 + i * step;
        let scratch = 0x1_0000_0000 + (i % 7) * 0x100_0000;
        at(
            t,
            ev(
                0,
                Alloc,
                Device,
                "cuMemAlloc_v2",
                scratch,
                8 * MIB + (i % 5) * MIB,
            ),
            1,
        );
        if leak_every > 0 && i % leak_every == 0 {
            at(t + 1, ev(0, Alloc, Device, "cuMemAlloc_v2", next, leak), 2);
            next += leak;
        }
        if i < cache_for {
            at(t + 2, ev(0, Alloc, Device, "cuMemAlloc_v2", next, cache), 3);
            next += cache;
        }
        at(
            t + step / 2,
            ev(0, Free, Device, "cuMemFree_v2", scratch, 0),
            1,
        );
    }
    r
}

fn growth_of(records: Vec<Record>) -> Growth {
    let s = summarize(&trace_of(7, records), SummaryOptions::default()).unwrap();
    s.growth.expect("a growth analysis")
}

#[test]
fn a_leak_among_steady_traffic_is_a_leak_at_its_rate() {
    // 2 MiB every 4 iterations of 10 ms: 50 MiB/s, 180,000 MiB/h.
    let g = growth_of(program(3000, 4, 2 * MIB, 0, 0));
    assert_eq!(g.verdict, Verdict::Leak, "{:#?}", g.evidence);
    let first = &g.lines[0];
    assert_eq!(first.verdict, LineVerdict::Leak);
    assert_eq!(first.level, "driver");
    let planted = 2.0 * MIB as f64 / 0.040 * 3600.0;
    let off = (first.bytes_per_hour - planted).abs() / planted;
    assert!(off < 0.05, "{} vs {planted}: {off}", first.bytes_per_hour);
    assert_eq!(first.live_bytes, 750 * 2 * MIB);
    assert_eq!(first.live_allocations, 750);
    // The oldest allocation it still holds is the first leak, at the first iteration.
    assert_eq!(first.oldest_t_ns, Some(3));
    assert!((g.rate_bytes_per_hour - planted).abs() / planted < 0.05);
    // The scratch line is steady.
    assert!(
        g.lines
            .iter()
            .all(|l| l.verdict != LineVerdict::Leak || l.live_bytes > 0)
    );
}

#[test]
fn a_cache_that_fills_and_stops_is_a_plateau() {
    let g = growth_of(program(3000, 0, 0, MIB, 900));
    assert_eq!(g.verdict, Verdict::Plateau, "{:#?}", g.evidence);
    let cache = g.lines.iter().find(|l| l.live_bytes == 900 * MIB).unwrap();
    assert_eq!(cache.verdict, LineVerdict::Plateau);
    // The warm-up ends where the cache stopped growing (iteration 900, 9 s).
    assert!(
        (8.0..10.5).contains(&g.steady_from_s),
        "{}",
        g.steady_from_s
    );
    assert!(g.rate_bytes_per_hour.abs() < 0.05 * 900.0 * MIB as f64 / 9.0 * 3600.0);
}

#[test]
fn steady_traffic_alone_is_none() {
    let g = growth_of(program(3000, 0, 0, 0, 0));
    assert_eq!(g.verdict, Verdict::None, "{:#?}", g.evidence);
    assert!(g.lines.iter().all(|l| l.verdict == LineVerdict::Steady));
    // Start-up is the first bucket: the first release came in it.
    assert_eq!(g.startup_end_s, g.bucket_s);
}

#[test]
fn tensors_kept_in_cached_segments_are_the_leak_not_the_segments() {
    use EventKind::*;
    use MemKind::*;
    // One 2 GiB segment; a steady activation tensor comes and goes; a 1 MiB tensor is kept
    // every 10 iterations.
    let mut r = vec![Record::Event(ev(
        1,
        Alloc,
        Device,
        "cuMemAlloc_v2",
        0x7000_0000_0000,
        2 << 30,
    ))];
    for i in 0..2000u64 {
        let t = 2 + i * 10 * MS;
        let mut act = tensor_alloc(t, 0x7000_0000_0000 + (1 << 30), 64 * MIB);
        act.stack = 1;
        r.push(Record::Tensor(act.clone()));
        if i % 10 == 0 {
            let mut kept = tensor_alloc(t + 1, 0x7000_0000_0000 + i * MIB / 10, MIB);
            kept.stack = 2;
            r.push(Record::Tensor(kept));
        }
        let mut free = act;
        free.t_ns = t + 5 * MS;
        free.action = vramtrace_format::TensorAction::Free;
        free.size = 0;
        r.push(Record::Tensor(free));
    }
    let g = growth_of(r);
    assert_eq!(g.verdict, Verdict::Leak, "{:#?}", g.evidence);
    assert_eq!(g.lines[0].level, "tensor");
    assert_eq!(g.lines[0].live_bytes, 200 * MIB);
    assert_eq!(g.lines[0].verdict, LineVerdict::Leak);
    // The activation line and the segment (no module says it is PyTorch's here) are steady.
    assert!(
        g.lines[1..]
            .iter()
            .all(|l| l.verdict == LineVerdict::Steady)
    );
}

#[test]
fn a_trace_too_short_to_tell_says_so() {
    let g = growth_of(crate::tests::known_sequence());
    assert_eq!(g.verdict, Verdict::None);
    assert!(g.evidence[0].contains("too short"), "{:?}", g.evidence);
}

/// A tensor leak (8 MiB about every 220 ms) in a ring that dropped the tensor records of the
/// first 85% of a 90 s run: the live set restated 4 s after the dropped block's last record.
fn ring_leak(dropped_to_s: u64) -> Vec<Record> {
    let mut r = vec![Record::Event(ev(
        1,
        EventKind::Alloc,
        MemKind::Device,
        "cuMemAlloc_v2",
        0x7000_0000_0000,
        40 << 30,
    ))];
    let cut = dropped_to_s * 1000 * MS;
    let mut restated = Vec::new();
    for i in 0..400u64 {
        let t = 1000 * MS + i * 220 * MS;
        let mut kept = tensor_alloc(t, 0x7000_0000_0000 + i * 8 * MIB, 8 * MIB);
        kept.stack = 2;
        if t < cut {
            // Restated when its block was reused, after the block's last record.
            kept.action = vramtrace_format::TensorAction::Live;
            kept.t_ns = cut + 4000 * MS;
            restated.push(Record::Tensor(kept));
        } else {
            r.push(Record::Tensor(kept));
        }
        // Traffic that lives through the whole run, so the pass has releases to see.
        let mut act = tensor_alloc(t + 1, 0x7a00_0000_0000, 64 * MIB);
        act.stack = 1;
        let mut free = act.clone();
        free.t_ns = t + 100 * MS;
        free.action = vramtrace_format::TensorAction::Free;
        if t >= cut {
            r.push(Record::Tensor(act));
            r.push(Record::Tensor(free));
        }
    }
    r.extend(restated);
    r.push(Record::Dropped {
        t_ns: cut,
        tid: 1,
        from_t_ns: 1000 * MS,
        to_t_ns: cut,
        index: 0,
    });
    r
}

#[test]
fn a_ring_that_dropped_most_tensor_detail_still_finds_the_leak() {
    let g = growth_of(ring_leak(75));
    assert_eq!(g.verdict, Verdict::Leak, "{:#?} {:#?}", g.evidence, g.lines);
    assert!(g.rests_on.contains("only from 79.4 s"), "{}", g.rests_on);
}

/// A decode loop whose forwards show (an embedding output each) and which keeps 1 MiB every
/// 4th step at its own line: the x axis is the steps, and the line grows 256 KiB a step.
#[test]
fn a_loop_that_shows_its_steps_has_them_as_its_x_axis() {
    let py = |stack: u32, file: u32, function: u32, line: u32| Record::PyStack {
        stack,
        frames: vec![vramtrace_format::PyFrame {
            file,
            function,
            line,
        }],
    };
    let text = |id: u32, text: &str| Record::String {
        id,
        text: text.into(),
    };
    let mut r = vec![
        text(10, "/usr/lib/python3/site-packages/torch/nn/functional.py"),
        text(11, "embedding"),
        text(12, "/app/loop.py"),
        text(13, "keep"),
        py(1, 10, 11, 2551),
        py(2, 12, 13, 7),
    ];
    for i in 0..2000u64 {
        // Steps come faster later (every 10 ms, then every 5 ms): per step, not per hour,
        // is what stays constant.
        let t = 1 + if i < 1000 {
            i * 10 * MS
        } else {
            10_000 * MS + (i - 1000) * 5 * MS
        };
        let mut h = tensor_alloc(t, 0x7000_0000_0000, 8 * MIB);
        h.stack = 1;
        r.push(Record::Tensor(h.clone()));
        if i % 4 == 0 {
            let mut kept = tensor_alloc(t + 1, 0x7100_0000_0000 + i * MIB, MIB);
            kept.stack = 2;
            r.push(Record::Tensor(kept));
        }
        h.t_ns = t + MS;
        h.action = vramtrace_format::TensorAction::Free;
        h.size = 0;
        r.push(Record::Tensor(h));
    }
    let g = growth_of(r);
    assert_eq!(g.x_axis, "steps");
    assert!(g.steady_steps > 1500, "{}", g.steady_steps);
    let kept = g
        .lines
        .iter()
        .find(|l| l.place == "loop.py:7 keep")
        .unwrap();
    assert_eq!(kept.verdict, LineVerdict::Leak);
    let per_step = kept.bytes_per_step.unwrap();
    assert!(
        (per_step - MIB as f64 / 4.0).abs() < 0.03 * MIB as f64 / 4.0,
        "{per_step}"
    );
}

/// A decode loop's reserve: tensors come and go in the same segments, and now and then a longer
/// prompt than any before takes a new segment, the last one late in the run. Growth in a few
/// steps is a plateau that has not settled yet, never a leak (as the H200's decode loop of
/// 2026-12-03 23:37 was judged before this rule).
#[test]
fn a_reserve_that_steps_up_a_few_times_is_not_a_leak() {
    use EventKind::*;
    use MemKind::*;
    let mut r = vec![Record::Event(ev(
        1,
        Alloc,
        Device,
        "cuMemAlloc_v2",
        0x7000_0000_0000,
        1 << 30,
    ))];
    let mut segment = 0x7100_0000_0000u64;
    for i in 0..3000u64 {
        let t = 2 + i * 10 * MS;
        if [100, 900, 2400, 2700].contains(&i) {
            r.push(Record::Event(ev(
                t,
                Alloc,
                Device,
                "cuMemAlloc_v2",
                segment,
                64 * MIB,
            )));
            segment += 1 << 32;
        }
        let mut act = tensor_alloc(t + 1, 0x7000_0000_0000, 256 * MIB);
        act.stack = 1;
        r.push(Record::Tensor(act.clone()));
        act.t_ns = t + 5 * MS;
        act.action = vramtrace_format::TensorAction::Free;
        act.size = 0;
        r.push(Record::Tensor(act));
    }
    let g = growth_of(r);
    assert_ne!(g.verdict, Verdict::Leak, "{:#?}", g.evidence);
    assert!(g.lines.iter().all(|l| l.verdict != LineVerdict::Leak));
}
