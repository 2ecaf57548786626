//! The readers' benchmark (issue 12): a 10 M-event trace read, replayed and summarised.
//!
//! `cargo bench -p vramtrace --bench readers` writes a synthetic version 2 trace (two processes,
//! four threads each, two devices each, allocations and releases of a slowly drifting live set,
//! stream-ordered pairs, a few failed allocations, named tensors, thousands of distinct stacks)
//! under `target/bench-readers/` once, then measures:
//! - in this process, one pass of the merged time-ordered stream (`Trace::items`), and one
//!   pass through the replay, in events per second;
//! - as child processes, the real `vramtrace summary`, `events` and `compare` on the trace:
//!   wall time and peak resident memory (`ru_maxrss` from `wait4`).
//!
//! Each figure is printed beside its target with the ratio (measured / target for times and
//! memory, target / measured for rates: a ratio at or below 1 meets the target).
//! Each figure is the best of 3 runs (`VRAMTRACE_BENCH_RUNS=N` changes that), shown with the
//! CPU time it took beside the wall time: on a shared machine the wall time includes waiting
//! for a core, the CPU time does not. `VRAMTRACE_BENCH_EVENTS=N` changes the trace length;
//! `VRAMTRACE_BENCH_IN_PROCESS=1` measures only the in-process streams (no child processes).

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use vramtrace::Trace;
use vramtrace::replay::Replayer;
use vramtrace::trace::Item;
use vramtrace_format::{
    Annotation, Api, BLOCK_HEADER_LEN, BlockHeader, DEFAULT_BLOCK_SIZE, Deltas, DeviceInfo, Event,
    EventKind, FRAME_HEADER_LEN, FileReader, Header, MAX_EVENT_RECORD_LEN, MAX_PAYLOAD, MemKind,
    ModuleInfo, Record, encode_event, frame_record,
};

const PROCESSES: u32 = 2;
const THREADS: u32 = 4;
const STACKS: u32 = 4000;
const FRAMES: u64 = 24;
/// Live allocations each thread drifts around.
const LIVE_PER_THREAD: usize = 2500;
/// Bumped whenever the generated trace changes, so a stale one is rewritten.
const GENERATOR: &str = "readers-bench v2.1";

/// xorshift64*: reproducible and dependency-free.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// Writes one process's version 2 file as the preload lays it out: each thread fills its own
/// fixed-size block, taking the next block of the file when its block is full.
struct BlockWriter {
    file: File,
    data_offset: u64,
    next_block: u64,
    /// Per thread: its block's bytes, index, fill and deltas.
    threads: Vec<(Vec<u8>, u64, usize, Deltas)>,
    scratch: Vec<u8>,
}

impl BlockWriter {
    fn create(path: &Path, header: &Header, threads: usize) -> BlockWriter {
        let mut bytes = Vec::new();
        let data_offset = header.encode_blocks(DEFAULT_BLOCK_SIZE, &mut bytes);
        bytes.resize(data_offset as usize, 0);
        let file = File::create(path).unwrap();
        file.write_all_at(&bytes, 0).unwrap();
        BlockWriter {
            file,
            data_offset,
            next_block: 0,
            threads: (0..threads)
                .map(|_| (Vec::new(), 0, 0, Deltas::default()))
                .collect(),
            scratch: vec![0u8; FRAME_HEADER_LEN + MAX_PAYLOAD],
        }
    }

    fn put(&mut self, thread: usize, tid: u32, now: u64, record: &Record) {
        let mut rec = [0u8; MAX_EVENT_RECORD_LEN];
        let mut side = Vec::new();
        for _ in 0..2 {
            let (block, _, pos, deltas) = &mut self.threads[thread];
            let mut d = *deltas;
            let bytes: &[u8] = match record {
                Record::Event(ev) => {
                    let n = encode_event(ev, &mut d, &mut rec);
                    &rec[..n]
                }
                other => {
                    if side.is_empty() {
                        let frame = other.encode(&mut self.scratch);
                        side = vec![0u8; frame.len() + 10];
                        let n =
                            frame_record(frame[1], &frame[FRAME_HEADER_LEN..], &mut side).unwrap();
                        side.truncate(n);
                    }
                    &side
                }
            };
            if !block.is_empty() && *pos + bytes.len() <= block.len() {
                block[*pos..*pos + bytes.len()].copy_from_slice(bytes);
                *pos += bytes.len();
                *deltas = d;
                return;
            }
            self.flush(thread);
            let h = BlockHeader {
                tid,
                seq: self.next_block,
                base_t_ns: now,
                flags: 0,
            };
            let mut block = vec![0u8; DEFAULT_BLOCK_SIZE as usize];
            block[..BLOCK_HEADER_LEN].copy_from_slice(&h.encode());
            self.threads[thread] = (
                block,
                self.next_block,
                BLOCK_HEADER_LEN,
                Deltas::at_block_start(&h),
            );
            self.next_block += 1;
        }
        panic!("a record does not fit in an empty block");
    }

    fn flush(&mut self, thread: usize) {
        let (block, index, _, _) = &self.threads[thread];
        if !block.is_empty() {
            let at = self.data_offset + index * u64::from(DEFAULT_BLOCK_SIZE);
            self.file.write_all_at(block, at).unwrap();
        }
    }

    fn finish(mut self) -> u64 {
        for t in 0..self.threads.len() {
            self.flush(t);
        }
        let len = self.data_offset + self.next_block * u64::from(DEFAULT_BLOCK_SIZE);
        self.file.set_len(len).unwrap();
        len
    }
}

/// One thread's allocations: what it holds, so that releases pair and the live set drifts.
struct ThreadState {
    tid: u32,
    device: i32,
    live: Vec<(u64, bool)>, // (pointer, stream-ordered)
    next_ptr: u64,
}

/// Writes the trace and returns (events written, bytes on disk).
fn generate(dir: &Path, events: u64) -> (u64, u64) {
    std::fs::create_dir_all(dir).unwrap();
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let per_process = events / u64::from(PROCESSES);
    let mut written = 0;
    let mut bytes = 0;
    let api = |n: &str| Api::from_name(n).unwrap();
    let names = [
        "q",
        "k",
        "v",
        "o",
        "g (cumsum)",
        "A",
        "w",
        "u",
        "h",
        "v_new",
    ];
    for p in 0..PROCESSES {
        let pid = 4000 + p;
        let start = 1_000_000_000 + u64::from(p) * 1000;
        let header = Header {
            pid,
            ppid: 1,
            start_mono_ns: start,
            start_unix_ns: 1_700_000_000_000_000_000,
            hostname: "bench".into(),
            cmdline: vec!["python".into(), "serve.py".into(), format!("--rank={p}")],
            ..Header::default()
        };
        let mut w = BlockWriter::create(&dir.join(format!("{pid}.vtr")), &header, THREADS as usize);
        let mut now = start;
        let tid0 = pid * 10;
        w.put(0, tid0, now, &Record::Driver { version: 13000 });
        for d in 0..2 {
            w.put(
                0,
                tid0,
                now,
                &Record::Device(DeviceInfo {
                    ordinal: (2 * p + d) as i32,
                    total_bytes: 150 << 30,
                    name: "NVIDIA H200".into(),
                }),
            );
        }
        w.put(
            0,
            tid0,
            now,
            &Record::Module(ModuleInfo {
                start: 0x7f00_0000_0000,
                end: 0x7f00_1000_0000,
                bias: 0x7f00_0000_0000,
                path: "/nonexistent/libtorch_cuda.so".into(),
                build_id: vec![1, 2, 3, 4],
            }),
        );
        for (i, text) in ["prefill/attn", "prefill/gdn", "decode", "bf16", "f32"]
            .iter()
            .chain(names.iter())
            .enumerate()
        {
            w.put(
                0,
                tid0,
                now,
                &Record::String {
                    id: i as u32 + 1,
                    text: (*text).into(),
                },
            );
        }
        let mut stack_seen = vec![false; STACKS as usize + 1];
        let mut threads: Vec<ThreadState> = (0..THREADS)
            .map(|t| ThreadState {
                tid: tid0 + t,
                device: (2 * p + t % 2) as i32,
                live: Vec::with_capacity(2 * LIVE_PER_THREAD),
                next_ptr: 0x7000_0000_0000 + (u64::from(t) << 36),
            })
            .collect();
        let mut n = 0;
        while n < per_process {
            let t = rng.below(u64::from(THREADS)) as usize;
            now += 1 + rng.below(200);
            let th = &mut threads[t];
            // Slow drift around the target live set: grow while below it, then mostly balance.
            let grow = if th.live.len() < LIVE_PER_THREAD / 2 {
                rng.below(100) < 90
            } else {
                rng.below(1000) < 505 - (th.live.len() as u64 * 10 / LIVE_PER_THREAD as u64)
            };
            let stack = 1 + rng.below(u64::from(STACKS)) as u32;
            if !stack_seen[stack as usize] {
                stack_seen[stack as usize] = true;
                let frames = (0..FRAMES)
                    .map(|f| 0x7f00_0000_0000 + u64::from(stack) * 4096 + f * 64)
                    .collect();
                w.put(t, th.tid, now, &Record::Stack { id: stack, frames });
            }
            let label = 1 + rng.below(3) as u32;
            if grow || th.live.is_empty() {
                // Sizes from 512 B to 64 MiB, log-uniform.
                let size = 512u64 << rng.below(18);
                let size = size + rng.below(size) / 512 * 512;
                let stream_ordered = rng.below(4) == 0;
                if rng.below(2_000_000) == 0 {
                    let ev = Event {
                        t_ns: now,
                        tid: th.tid,
                        device: th.device,
                        kind: EventKind::AllocFailed,
                        mem: MemKind::Device,
                        api: api("cuMemAlloc_v2"),
                        result: 2,
                        size: 80 << 30,
                        free_bytes: 3 << 30,
                        total_bytes: 150 << 30,
                        stack,
                        label,
                        ..Event::default()
                    };
                    w.put(t, th.tid, now, &Record::Event(ev));
                    n += 1;
                    continue;
                }
                let ptr = th.next_ptr;
                th.next_ptr += size.div_ceil(512) * 512;
                let ev = Event {
                    t_ns: now,
                    tid: th.tid,
                    device: th.device,
                    kind: EventKind::Alloc,
                    mem: MemKind::Device,
                    api: api(if stream_ordered {
                        "cuMemAllocAsync"
                    } else {
                        "cuMemAlloc_v2"
                    }),
                    ptr,
                    size,
                    stream: if stream_ordered { 0x5000 + t as u64 } else { 0 },
                    stack,
                    label,
                    ..Event::default()
                };
                w.put(t, th.tid, now, &Record::Event(ev));
                th.live.push((ptr, stream_ordered));
                n += 1;
                if rng.below(20) == 0 {
                    now += 1;
                    let name = 6 + rng.below(names.len() as u64) as u32;
                    let a = Annotation {
                        t_ns: now,
                        tid: th.tid,
                        ptr,
                        name,
                        dtype: 4,
                        shape: vec![4128, 48, 128],
                        op: false,
                    };
                    w.put(t, th.tid, now, &Record::Annotate(a));
                }
            } else {
                let i = rng.below(th.live.len() as u64) as usize;
                let (ptr, stream_ordered) = th.live.swap_remove(i);
                let ev = Event {
                    t_ns: now,
                    tid: th.tid,
                    device: th.device,
                    kind: EventKind::Free,
                    mem: MemKind::Device,
                    api: api(if stream_ordered {
                        "cuMemFreeAsync"
                    } else {
                        "cuMemFree_v2"
                    }),
                    ptr,
                    stream: if stream_ordered { 0x5000 + t as u64 } else { 0 },
                    stack,
                    label,
                    ..Event::default()
                };
                w.put(t, th.tid, now, &Record::Event(ev));
                n += 1;
            }
        }
        written += n;
        bytes += w.finish();
    }
    std::fs::write(dir.join("GENERATOR"), format!("{GENERATOR} {events}\n")).unwrap();
    (written, bytes)
}

/// Wall and CPU time of one measurement (the best of several), and for a child process its
/// peak resident memory.
#[derive(Clone, Copy, Debug)]
struct Times {
    wall: Duration,
    cpu: Duration,
    rss: u64,
}

impl Times {
    fn min(self, o: Times) -> Times {
        Times {
            wall: self.wall.min(o.wall),
            cpu: self.cpu.min(o.cpu),
            rss: self.rss.max(o.rss),
        }
    }
}

/// CPU time this thread has used.
fn thread_cpu() -> Duration {
    // Safety: an all-zero timespec is a valid value for clock_gettime to fill.
    let mut ts: libc::timespec = unsafe { std::mem::zeroed() };
    // Safety: `ts` outlives the call.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// Runs `f` `runs` times; its result and the best wall and best CPU time. On a shared machine
/// the CPU time is what the pass costs; the wall time includes waiting for a core.
fn best<T>(runs: usize, mut f: impl FnMut() -> T) -> (T, Times) {
    let mut out = None;
    let mut times: Option<Times> = None;
    for _ in 0..runs {
        let (w, c) = (Instant::now(), thread_cpu());
        let r = f();
        let t = Times {
            wall: w.elapsed(),
            cpu: thread_cpu() - c,
            rss: 0,
        };
        times = Some(times.map_or(t, |b| b.min(t)));
        out = Some(r);
    }
    (out.unwrap(), times.unwrap())
}

/// The best of `runs` runs of a child process.
fn best_child(runs: usize, cmd: &mut Command) -> Times {
    (0..runs)
        .map(|_| run_child(cmd))
        .reduce(Times::min)
        .unwrap()
}

/// Wall time, CPU time (user + system) and peak resident memory of a child process. The child is reaped by `wait4`
/// (which alone reports that child's own times), not by `Child::wait`. Its peak memory is what
/// it says itself under `VRAMTRACE_PEAK_RSS` (`VmHWM` since its exec): `ru_maxrss` would also
/// count this bench's own memory, held by the child until its exec.
#[allow(clippy::zombie_processes)]
fn run_child(cmd: &mut Command) -> Times {
    let started = Instant::now();
    let err = std::env::temp_dir().join(format!("vramtrace-bench-{}.stderr", std::process::id()));
    let child = cmd
        .stdout(Stdio::null())
        .stderr(File::create(&err).unwrap())
        .env("VRAMTRACE_PEAK_RSS", "1")
        .spawn()
        .unwrap();
    let mut status = 0;
    // Safety: an all-zero rusage is a valid value for wait4 to fill.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // Safety: waits for our own child, once; `status` and `usage` outlive the call.
    let r = unsafe { libc::wait4(child.id() as i32, &mut status, 0, &mut usage) };
    let wall = started.elapsed();
    assert_eq!(r, child.id() as i32, "wait4 failed");
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "{cmd:?} failed: status {status}"
    );
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    let said = std::fs::read_to_string(&err).unwrap_or_default();
    let _ = std::fs::remove_file(&err);
    let rss = vramtrace_testkit::said_peak_memory(&said)
        .unwrap_or_else(|| panic!("{cmd:?} did not say its peak memory: {said}"));
    Times {
        wall,
        cpu: tv(usage.ru_utime) + tv(usage.ru_stime),
        rss,
    }
}

struct Table(Vec<[String; 4]>);

impl Table {
    fn time(&mut self, what: &str, t: Times, target_s: f64) {
        let s = t.wall.as_secs_f64();
        self.0.push([
            what.into(),
            format!("{s:.2} s (cpu {:.2} s)", t.cpu.as_secs_f64()),
            format!("≤ {target_s} s"),
            format!("{:.2}", s / target_s),
        ]);
    }

    /// `a` over `b`, both measured in this run, against a ratio target.
    fn ratio(&mut self, what: &str, a: Times, b: Times, target: f64) {
        let wall = a.wall.as_secs_f64() / b.wall.as_secs_f64();
        let cpu = a.cpu.as_secs_f64() / b.cpu.as_secs_f64();
        self.0.push([
            what.into(),
            format!("{wall:.2}× (cpu {cpu:.2}×)"),
            format!("≤ {target}×"),
            format!("{:.2}", wall / target),
        ]);
    }

    fn memory(&mut self, what: &str, bytes: u64, target_mib: u64) {
        let mib = bytes as f64 / (1 << 20) as f64;
        self.0.push([
            what.into(),
            format!("{mib:.0} MiB"),
            format!("≤ {target_mib} MiB"),
            format!("{:.2}", mib / target_mib as f64),
        ]);
    }

    fn rate(&mut self, what: &str, events: u64, t: Times, target_m: f64) {
        let m = events as f64 / t.wall.as_secs_f64() / 1e6;
        let cpu = events as f64 / t.cpu.as_secs_f64() / 1e6;
        self.0.push([
            what.into(),
            format!("{m:.1} M events/s (cpu {cpu:.1})"),
            format!("≥ {target_m} M events/s"),
            format!("{:.2}", target_m / m),
        ]);
    }

    fn print(&self) {
        let w: Vec<usize> = (0..4)
            .map(|c| {
                self.0
                    .iter()
                    .map(|r| r[c].chars().count())
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        println!(
            "| {:<a$} | {:<b$} | {:<c$} | {:<d$} |",
            "measure",
            "measured",
            "target",
            "ratio",
            a = w[0],
            b = w[1],
            c = w[2],
            d = w[3]
        );
        for r in &self.0 {
            println!(
                "| {:<a$} | {:>b$} | {:<c$} | {:>d$} |",
                r[0],
                r[1],
                r[2],
                r[3],
                a = w[0],
                b = w[1],
                c = w[2],
                d = w[3]
            );
        }
    }
}

fn main() {
    // `cargo bench` passes `--bench`; a filter argument is not used.
    let events: u64 = std::env::var("VRAMTRACE_BENCH_EVENTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000_000);
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir: PathBuf = root
        .join("target/bench-readers")
        .join(format!("trace-{events}"));
    let marker = std::fs::read_to_string(dir.join("GENERATOR")).unwrap_or_default();
    if marker != format!("{GENERATOR} {events}\n") {
        let _ = std::fs::remove_dir_all(&dir);
        let t = Instant::now();
        let (n, bytes) = generate(&dir, events);
        eprintln!(
            "wrote {n} events in {} files ({:.1} MiB, {:.1} bytes/event) to {} in {:.1} s",
            PROCESSES,
            bytes as f64 / (1 << 20) as f64,
            bytes as f64 / n as f64,
            dir.display(),
            t.elapsed().as_secs_f64()
        );
    }
    let exe = env!("CARGO_BIN_EXE_vramtrace");
    let runs: usize = std::env::var("VRAMTRACE_BENCH_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3)
        .max(1);
    let mut table = Table(Vec::new());

    // In process: the format crate's per-file streams alone, the merged stream, then the
    // merged stream through the replay; each the best of `runs` passes.
    let files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|f| f.unwrap().path())
        .filter(|f| f.extension().is_some_and(|x| x == "vtr"))
        .collect();
    let (raw, t_raw) = best(runs, || {
        let mut raw = 0u64;
        for f in &files {
            let r = FileReader::open(f).unwrap();
            raw += r
                .timed()
                .unwrap()
                .filter(|r| matches!(r, Record::Event(_)))
                .count() as u64;
        }
        raw
    });
    table.rate("read: FileReader::timed per file", raw, t_raw, 20.0);
    let t = Instant::now();
    let trace = Trace::open(&dir).unwrap();
    let open = t.elapsed();
    let ((n_events, n_items), t_read) = best(runs, || {
        let mut n_events = 0u64;
        let mut n_items = 0u64;
        for (_, it) in trace.items().unwrap() {
            n_items += 1;
            n_events += u64::from(matches!(it, Item::Event(_)));
        }
        (n_events, n_items)
    });
    let (_, t_replay) = best(runs, || {
        let mut replay = Replayer::new();
        for (seq, (pi, it)) in trace.items().unwrap().enumerate() {
            match it {
                Item::Event(e) => {
                    replay.apply(pi, seq, &e);
                }
                Item::Annotate(a) => {
                    replay.annotate(pi, &a);
                }
                _ => {}
            }
        }
        replay.live_len()
    });
    eprintln!(
        "{n_events} events ({n_items} timed records) in {} processes; side tables read in {:.2} s",
        trace.processes.len(),
        open.as_secs_f64()
    );
    table.rate("read: merged time-ordered stream", n_events, t_read, 20.0);
    table.rate("replay: stream + live set", n_events, t_replay, 20.0);
    drop(trace);
    if std::env::var_os("VRAMTRACE_BENCH_IN_PROCESS").is_some() {
        table.print();
        return;
    }

    let d = dir.to_str().unwrap();
    let t = best_child(runs, Command::new(exe).args(["summary", d]));
    table.time("`vramtrace summary` wall", t, 5.0);
    table.memory("`vramtrace summary` peak RSS", t.rss, 256);
    table.rate("`vramtrace summary` throughput", n_events, t, 20.0);
    // Issue 34: `report --json` (growth included) beside `summary`, run in turns so that a
    // machine whose speed drifts moves both alike.
    let (mut summary_t, mut report_t) = (
        t,
        best_child(1, Command::new(exe).args(["report", "--json", d])),
    );
    for _ in 1..runs {
        summary_t = summary_t.min(best_child(1, Command::new(exe).args(["summary", d])));
        report_t = report_t.min(best_child(
            1,
            Command::new(exe).args(["report", "--json", d]),
        ));
    }
    table.time("`vramtrace report --json` wall", report_t, 15.0);
    table.memory("`vramtrace report --json` peak RSS", report_t.rss, 256);
    table.ratio(
        "`report --json` / `summary` (same run)",
        report_t,
        summary_t,
        3.0,
    );
    let config = root.join("samples/models/Qwen3.6-27B/config.json");
    let t = best_child(
        runs,
        Command::new(exe).args([
            "compare",
            d,
            "--model",
            config.to_str().unwrap(),
            "--kernel",
            "gdn",
        ]),
    );
    table.time("`vramtrace compare --at peak` wall", t, 5.0);
    table.memory("`vramtrace compare --at peak` peak RSS", t.rss, 256);
    let t = best_child(runs, Command::new(exe).args(["events", d]));
    table.time("`vramtrace events > /dev/null` wall", t, 5.0);
    table.memory("`vramtrace events > /dev/null` peak RSS", t.rss, 256);
    table.rate("`vramtrace events` throughput", n_events, t, 20.0);
    table.print();
}
