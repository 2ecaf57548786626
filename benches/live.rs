//! Follow speed of `vramtrace live`: a writer thread appends 100 k events/s (alloc/free pairs,
//! in 1 ms batches, stamped with CLOCK_MONOTONIC) to a trace directory while the live source
//! polls it every 100 ms, as the view does. Prints the lag right after each poll (now minus the
//! time of the latest event the view has sampled) and the process's resident memory, beside the
//! targets: at most 100 ms behind, memory bounded (flat while the trace grows).
//!
//! `cargo bench -p vramtrace --bench live [-- SECONDS [EVENTS_PER_S]]` (default 10 s, 100000).

#[path = "../tests/common/live_writer.rs"]
mod live_writer;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use live_writer::LiveWriter;
use vramtrace::live::{DirSource, LiveOptions};
use vramtrace_format::{Api, DeviceInfo, Event, EventKind, Header, MemKind, Record};
use vramtrace_view_model::LiveSource;

fn mono_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // Safety: a valid pointer to a timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

fn pct(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    v[((v.len() - 1) as f64 * p).round() as usize]
}

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    let secs: u64 = args.first().and_then(|s| s.parse().ok()).unwrap_or(10);
    let rate: u64 = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(100_000);
    let dir = std::env::temp_dir().join(format!("vramtrace-bench-live-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();

    let stop = Arc::new(AtomicBool::new(false));
    let written = Arc::new(AtomicU64::new(0));
    let start = mono_ns();
    let writer = {
        let (dir, stop, written) = (dir.clone(), stop.clone(), written.clone());
        std::thread::spawn(move || {
            let h = Header {
                pid: 4242,
                start_mono_ns: start,
                cmdline: vec!["bench-writer".into()],
                ..Header::default()
            };
            let mut w = LiveWriter::create(&dir.join("4242.vtr"), &h, 4242).unwrap();
            w.record(
                &Record::Device(DeviceInfo {
                    ordinal: 0,
                    total_bytes: 141 << 30,
                    name: "bench card".into(),
                }),
                start,
            )
            .unwrap();
            let alloc = Api::from_name("cuMemAlloc_v2").unwrap();
            let free = Api::from_name("cuMemFree_v2").unwrap();
            let per_batch = (rate / 1000).max(2) as usize;
            let mut batch = Vec::with_capacity(per_batch);
            let mut n = 0u64;
            let t_begin = Instant::now();
            let mut next = t_begin;
            // A slowly growing live set (one allocation in 64 is kept) over churn.
            let mut kept = 0u64;
            while !stop.load(Ordering::Relaxed) {
                batch.clear();
                let now = mono_ns();
                for i in 0..per_batch / 2 {
                    let ptr = 0x7000_0000_0000 + ((n + i as u64) % 4096) * 0x20_0000;
                    batch.push(Event {
                        t_ns: now,
                        kind: EventKind::Alloc,
                        mem: MemKind::Device,
                        api: alloc,
                        ptr,
                        size: 1 << 20,
                        ..Event::default()
                    });
                    if !(n / 2 + i as u64).is_multiple_of(64) {
                        batch.push(Event {
                            t_ns: now,
                            kind: EventKind::Free,
                            mem: MemKind::Device,
                            api: free,
                            ptr,
                            ..Event::default()
                        });
                    } else {
                        kept += 1;
                        let p = 0x1_0000_0000_0000 + kept * 0x20_0000;
                        batch.push(Event {
                            t_ns: now,
                            kind: EventKind::Alloc,
                            mem: MemKind::Device,
                            api: alloc,
                            ptr: p,
                            size: 4096,
                            ..Event::default()
                        });
                        // Keep the live set bounded too: free what was kept 1000 ago.
                        if kept > 1000 {
                            batch.push(Event {
                                t_ns: now,
                                kind: EventKind::Free,
                                mem: MemKind::Device,
                                api: free,
                                ptr: 0x1_0000_0000_0000 + (kept - 1000) * 0x20_0000,
                                ..Event::default()
                            });
                        }
                    }
                }
                n += batch.len() as u64;
                w.events(&batch).unwrap();
                written.store(now, Ordering::Release);
                next += Duration::from_millis(1);
                if let Some(d) = next.checked_duration_since(Instant::now()) {
                    std::thread::sleep(d);
                }
            }
            (n, t_begin.elapsed())
        })
    };

    let mut source = DirSource::new(
        &dir,
        LiveOptions {
            nvml: false,
            ..LiveOptions::default()
        },
    );
    let tick = Duration::from_millis(100);
    let mut lags_ms = Vec::new();
    let mut polls_ms = Vec::new();
    let mut rss = Vec::new();
    let began = Instant::now();
    let mut next = began;
    let mut updates = 0usize;
    println!(
        "follow speed: {rate} events/s for {secs} s into {}",
        dir.display()
    );
    println!(
        "{:>6} {:>12} {:>10} {:>9} {:>10} {:>9}",
        "t (s)", "events read", "poll (ms)", "lag (ms)", "RSS (MiB)", "live set"
    );
    while began.elapsed() < Duration::from_secs(secs) {
        let t = Instant::now();
        let u = source.poll();
        let poll = t.elapsed();
        updates += u.len();
        let view = source.latest_ns();
        let last_written = written.load(Ordering::Acquire);
        if view > 0 && began.elapsed() > Duration::from_millis(500) {
            // Now minus the latest event the view has: what the screen is behind right after
            // the poll; the tick adds up to 100 ms more between polls.
            lags_ms.push(mono_ns().saturating_sub(view) as f64 / 1e6);
            polls_ms.push(poll.as_secs_f64() * 1e3);
        }
        let r = rss_kib();
        rss.push(r);
        if rss.len().is_multiple_of(10) {
            println!(
                "{:>6.1} {:>12} {:>10.2} {:>9.2} {:>10.1} {:>9}",
                began.elapsed().as_secs_f64(),
                source.events(),
                poll.as_secs_f64() * 1e3,
                (mono_ns().saturating_sub(view)) as f64 / 1e6,
                r as f64 / 1024.0,
                source.live_len()
            );
        }
        let _ = last_written;
        next += tick;
        if let Some(d) = next.checked_duration_since(Instant::now()) {
            std::thread::sleep(d);
        }
    }
    stop.store(true, Ordering::Relaxed);
    let (n, took) = writer.join().unwrap();
    let written_rate = n as f64 / took.as_secs_f64();
    let size = std::fs::metadata(dir.join("4242.vtr"))
        .map(|m| m.len())
        .unwrap_or(0);
    let early = rss[rss.len() / 5] as f64 / 1024.0;
    let late = *rss.last().unwrap() as f64 / 1024.0;
    println!();
    println!(
        "writer: {n} events in {:.1} s = {:.0} events/s, trace {:.1} MiB",
        took.as_secs_f64(),
        written_rate,
        size as f64 / (1 << 20) as f64
    );
    println!(
        "view:   {} events replayed, {updates} updates sent (not one per event)",
        source.events()
    );
    println!(
        "lag after a poll: p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms   (target: <= 100 ms; the 100 ms tick adds at most 100 ms between polls)",
        pct(&mut lags_ms.clone(), 0.5),
        pct(&mut lags_ms.clone(), 0.99),
        pct(&mut lags_ms, 1.0)
    );
    println!(
        "poll time: p50 {:.2} ms, max {:.2} ms",
        pct(&mut polls_ms.clone(), 0.5),
        pct(&mut polls_ms, 1.0)
    );
    println!(
        "resident memory: {early:.1} MiB at 20% of the run, {late:.1} MiB at the end, while the trace grew to {:.1} MiB   (target: bounded by the live set, not the trace)",
        size as f64 / (1 << 20) as f64
    );
    let _ = std::fs::remove_dir_all(&dir);
}
