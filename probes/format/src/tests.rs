use super::*;
use std::io::Write;

fn header() -> Header {
    Header {
        version: STREAM_VERSION,
        pid: 4242,
        ppid: 1,
        start_unix_ns: 1_700_000_000_000_000_000,
        start_mono_ns: 123_456,
        hostname: "gpu-box".into(),
        cmdline: vec![
            "python3".into(),
            "serve.py".into(),
            "--model=Qwen/Qwen3.6-27B".into(),
        ],
    }
}

fn sample_records() -> Vec<Record> {
    let ev = |i: u64, kind| {
        Record::Event(Event {
            t_ns: 1000 + i,
            tid: 7 + i as u32,
            device: 0,
            kind,
            mem: MemKind::Device,
            api: Api(1),
            result: if kind == EventKind::AllocFailed { 2 } else { 0 },
            ptr: 0x7f00_0000_0000 + i * 4096,
            size: 50 << 20,
            stream: 0,
            aux: 0,
            free_bytes: if kind == EventKind::AllocFailed {
                30 << 20
            } else {
                0
            },
            total_bytes: if kind == EventKind::AllocFailed {
                24 << 30
            } else {
                0
            },
            stack: i as u32,
            label: 3,
        })
    };
    vec![
        Record::Driver { version: 13000 },
        Record::Device(DeviceInfo {
            ordinal: 0,
            total_bytes: 24 << 30,
            name: "NVIDIA GeForce RTX 3090".into(),
        }),
        Record::String {
            id: 3,
            text: "prefill/layer.0/gdn".into(),
        },
        Record::Stack {
            id: 1,
            frames: vec![0x1000, 0x2000, 0x3000],
        },
        Record::Module(ModuleInfo {
            start: 0x5555_0000,
            end: 0x5556_0000,
            bias: 0x5555_0000,
            path: "/usr/lib/libtorch_cuda.so".into(),
            build_id: vec![0xde, 0xad, 0xbe, 0xef],
        }),
        ev(0, EventKind::Alloc),
        Record::Annotate(Annotation {
            t_ns: 5,
            tid: 9,
            ptr: 0x7f00_0000_0000,
            name: 3,
            dtype: 4,
            shape: vec![1, 4128, 48, 128],
            op: false,
        }),
        Record::RangePush {
            t_ns: 6,
            tid: 9,
            name: 3,
        },
        ev(1, EventKind::AllocFailed),
        Record::RangePop { t_ns: 7, tid: 9 },
        Record::Mark {
            t_ns: 8,
            tid: 9,
            name: 3,
        },
        ev(2, EventKind::Free),
        Record::Note {
            t_ns: 9,
            text: "recording stopped: disk full".into(),
        },
        Record::Dropped {
            t_ns: 10,
            tid: 9,
            from_t_ns: 2,
            to_t_ns: 8,
            index: 3,
        },
    ]
}

fn encode_file(h: &Header, records: &[Record]) -> Vec<u8> {
    let mut bytes = Vec::new();
    h.encode(&mut bytes);
    let mut buf = vec![0u8; 70_000];
    for r in records {
        bytes.extend_from_slice(r.encode(&mut buf));
    }
    bytes
}

#[test]
fn round_trip_every_record_kind() {
    let recs = sample_records();
    let bytes = encode_file(&header(), &recs);
    let t = TraceFile::from_bytes("t".as_ref(), &bytes).unwrap();
    assert_eq!(t.header, header());
    assert_eq!(t.records, recs);
    assert!(t.problems.is_empty());
    assert_eq!(t.driver_version, Some(13000));
    assert_eq!(t.devices.len(), 1);
    assert_eq!(t.devices[0].total_bytes, 24 << 30);
}

#[test]
fn event_record_has_fixed_size() {
    let mut rec = [0u8; EVENT_RECORD_LEN];
    Event::default().encode(&mut rec);
    assert_eq!(EVENT_RECORD_LEN, 88);
    assert_eq!(rec[0], FRAME_MAGIC);
    assert_eq!(
        u16::from_le_bytes([rec[2], rec[3]]) as usize,
        EVENT_PAYLOAD_LEN
    );
}

/// Cut the file at every byte: what is read back is always exactly the records that were whole,
/// and a cut inside a record is reported as a torn tail.
#[test]
fn truncation_at_every_byte_never_misreads() {
    let recs = sample_records();
    let h = header();
    let bytes = encode_file(&h, &recs);
    let mut hdr = Vec::new();
    h.encode(&mut hdr);
    // Offsets where each record ends.
    let mut ends = Vec::new();
    let mut buf = vec![0u8; 70_000];
    let mut off = hdr.len();
    for r in &recs {
        off += r.encode(&mut buf).len();
        ends.push(off);
    }
    for cut in 0..=bytes.len() {
        let part = &bytes[..cut];
        match TraceFile::from_bytes("t".as_ref(), part) {
            Err(ReadError::Header(_, HeaderError::Truncated)) => assert!(cut < hdr.len()),
            Err(e) => panic!("cut at {cut}: {e}"),
            Ok(t) => {
                assert!(cut >= hdr.len());
                let whole = ends.iter().filter(|&&e| e <= cut).count();
                assert_eq!(t.records, recs[..whole].to_vec(), "cut at {cut}");
                let on_boundary = cut == hdr.len() || ends.contains(&cut);
                if on_boundary {
                    assert!(t.problems.is_empty(), "cut at {cut}: {:?}", t.problems);
                } else {
                    assert!(
                        matches!(t.problems.as_slice(), [Problem::TornTail { .. }]),
                        "cut at {cut}: {:?}",
                        t.problems
                    );
                }
            }
        }
    }
}

#[test]
fn corruption_in_the_middle_is_skipped_and_reported() {
    let recs = sample_records();
    let mut bytes = encode_file(&header(), &recs);
    let mut hdr = Vec::new();
    header().encode(&mut hdr);
    // Flip a byte inside the first record's payload.
    bytes[hdr.len() + FRAME_HEADER_LEN] ^= 0xFF;
    let t = TraceFile::from_bytes("t".as_ref(), &bytes).unwrap();
    assert_eq!(t.records, recs[1..].to_vec());
    assert!(matches!(t.problems.as_slice(), [Problem::Corrupt { .. }]));
}

#[test]
fn unknown_kinds_are_skipped() {
    let mut bytes = Vec::new();
    header().encode(&mut bytes);
    let mut buf = [0u8; 64];
    let mut e = Encoder::new(&mut buf);
    e.u64(1).u64(2);
    bytes.extend_from_slice(e.finish(200));
    let recs = sample_records();
    let mut buf = vec![0u8; 70_000];
    bytes.extend_from_slice(recs[0].encode(&mut buf));
    let t = TraceFile::from_bytes("t".as_ref(), &bytes).unwrap();
    assert_eq!(
        t.records,
        vec![Record::Unknown { kind: 200 }, recs[0].clone()]
    );
}

#[test]
fn bad_magic_and_newer_versions_are_refused() {
    assert!(matches!(
        TraceFile::from_bytes("t".as_ref(), b"hello world, not a trace"),
        Err(ReadError::Header(_, HeaderError::NotATrace))
    ));
    let mut bytes = Vec::new();
    header().encode(&mut bytes);
    bytes[8] = 99;
    assert!(matches!(
        TraceFile::from_bytes("t".as_ref(), &bytes),
        Err(ReadError::Header(_, HeaderError::UnsupportedVersion(99)))
    ));
}

#[test]
fn follower_reads_a_growing_file_a_byte_at_a_time() {
    let dir = std::env::temp_dir().join(format!("vramtrace-format-follow-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("1.vtr");
    let recs = sample_records();
    let bytes = encode_file(&header(), &recs);
    let mut f = std::fs::File::create(&path).unwrap();
    let mut follower = Follower::open(&path).unwrap();
    let mut got = Vec::new();
    for b in &bytes {
        f.write_all(std::slice::from_ref(b)).unwrap();
        f.flush().unwrap();
        let (r, problems) = follower.poll().unwrap();
        assert!(problems.is_empty());
        got.extend(r);
    }
    assert_eq!(follower.header(), Some(&header()));
    assert_eq!(got, recs);
    assert_eq!(follower.pending_bytes(), 0);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn long_strings_are_clamped_not_overflowed() {
    let mut buf = [0u8; 64];
    let mut e = Encoder::new(&mut buf);
    e.u32(1);
    e.str(&"é".repeat(100));
    assert!(!e.overflowed());
    let rec = e.finish(kind::DEVICE).to_vec();
    assert!(rec.len() <= 64);
}

fn write_temp(name: &str, bytes: &[u8]) -> (std::path::PathBuf, std::path::PathBuf) {
    let dir = std::env::temp_dir().join(format!("vramtrace-format-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("1.vtr");
    std::fs::write(&path, bytes).unwrap();
    (dir, path)
}

/// A good header, then 256 MiB of zeros (a sparse file): the stream drops bytes where no record
/// can start ([`Scan::dead`]) instead of scanning them again with each chunk, so its work is
/// linear in the file and its buffer bounded. Bounded by the bytes scanned, not by a clock: the
/// reader that kept every unconsumed byte scanned 256 MiB × 256 chunks / 2, some 32 GiB.
#[test]
fn a_body_of_zeros_is_scanned_once_in_bounded_memory() {
    let mut bytes = Vec::new();
    header().encode(&mut bytes);
    let (dir, path) = write_temp("zeros-v1", &bytes);
    let len: u64 = 256 << 20;
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(len)
        .unwrap();
    let f = FileReader::open(&path).unwrap();
    let mut all = f.records().unwrap();
    assert_eq!(all.by_ref().count(), 0);
    let (scanned, most_buffered) = all.work().unwrap();
    assert!(
        scanned <= 2 * len,
        "scanned {scanned} bytes of a {len}-byte file"
    );
    assert!(
        most_buffered <= 2 << 20,
        "buffered {most_buffered} bytes at once"
    );
    match all.problems() {
        [Problem::TornTail { bytes, .. }] => assert!(*bytes > len - 4096, "{bytes}"),
        p => panic!("{p:?}"),
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn file_reader_streams_a_version_1_file() {
    let recs = sample_records();
    let mut bytes = encode_file(&header(), &recs);
    bytes.extend_from_slice(&[FRAME_MAGIC, kind::EVENT, 80]); // a torn last record
    let (dir, path) = write_temp("stream-v1", &bytes);
    let f = FileReader::open(&path).unwrap();
    assert_eq!(f.header(), &header());
    let mut all = f.records().unwrap();
    assert_eq!(all.by_ref().collect::<Vec<_>>(), recs);
    assert!(matches!(
        all.problems(),
        [Problem::TornTail { bytes: 3, .. }]
    ));
    let mut timed = f.timed().unwrap();
    let got: Vec<Record> = timed.by_ref().collect();
    let mut want: Vec<Record> = recs
        .iter()
        .filter(|r| time_of(r).is_some())
        .cloned()
        .collect();
    want.sort_by_key(|r| time_of(r).unwrap());
    assert_eq!(got, want);
    assert_eq!(
        got.iter().map(|r| time_of(r).unwrap()).collect::<Vec<_>>(),
        [5, 6, 7, 8, 1000, 1001, 1002]
    );
    assert!(matches!(timed.problems(), [Problem::TornTail { .. }]));
    std::fs::remove_dir_all(&dir).unwrap();
}

// ---- Version 2: blocks ----

const BS: u32 = 4096;

/// Records on three threads, times interleaved across them, with every field of an event used
/// somewhere (extremes included).
fn threaded_records() -> Vec<(u32, Record)> {
    let mut out = Vec::new();
    let mut t = 1_000_000u64;
    for i in 0..2000u64 {
        let tid = [11, 12, 13][(i % 3) as usize];
        t += [0, 7, 130_000, 1][(i % 4) as usize];
        let kind = [EventKind::Alloc, EventKind::Free, EventKind::AllocFailed][(i % 3) as usize];
        let failed = kind == EventKind::AllocFailed;
        out.push((
            tid,
            Record::Event(Event {
                t_ns: t,
                tid,
                device: if i % 7 == 0 { -1 } else { (i % 2) as i32 },
                kind,
                mem: if i % 5 == 0 {
                    MemKind::Host
                } else {
                    MemKind::Device
                },
                api: Api((i % 23) as u16),
                result: if failed { 2 } else { 0 },
                ptr: if i % 11 == 0 {
                    u64::MAX - i
                } else {
                    0x7f00_0000_0000 + (i % 9) * 4096
                },
                size: if kind == EventKind::Free {
                    0
                } else {
                    1 << (i % 40)
                },
                stream: if i % 13 == 0 { 0xdead_beef } else { 0 },
                aux: if i % 17 == 0 { u64::MAX } else { 0 },
                free_bytes: if failed { 30 << 20 } else { 0 },
                total_bytes: if failed { 24 << 30 } else { 0 },
                stack: (i % 4) as u32,
                label: if i % 2 == 0 { u32::MAX } else { 0 },
            }),
        ));
        if i % 50 == 0 {
            // Side records between events, timed and untimed.
            for r in sample_records() {
                match r {
                    Record::Event(_) => {}
                    Record::Annotate(a) => {
                        out.push((tid, Record::Annotate(Annotation { t_ns: t, tid, ..a })))
                    }
                    Record::RangePush { name, .. } => {
                        out.push((tid, Record::RangePush { t_ns: t, tid, name }))
                    }
                    Record::RangePop { .. } => out.push((tid, Record::RangePop { t_ns: t, tid })),
                    Record::Mark { name, .. } => {
                        out.push((tid, Record::Mark { t_ns: t, tid, name }))
                    }
                    other => out.push((tid, other)),
                }
            }
        }
    }
    out
}

/// A version 2 file of `recs`, each record's (offset, length) and the writer's bytes before it.
type Written = (Vec<u8>, Vec<(u64, usize)>, Vec<Vec<u8>>);

fn block_file(recs: &[(u32, Record)]) -> Written {
    let mut w = BlockFileWriter::new(&header(), BS);
    let mut at = Vec::new();
    let mut before = Vec::new();
    for (tid, r) in recs {
        before.push(w.bytes().to_vec());
        at.push(w.push(*tid, r).expect("fits"));
    }
    (w.finish(), at, before)
}

fn v2_header() -> Header {
    Header {
        version: BLOCKS_VERSION,
        ..header()
    }
}

/// The records in storage order: by offset.
fn in_storage_order(recs: &[(u32, Record)], at: &[(u64, usize)]) -> Vec<Record> {
    let mut v: Vec<(u64, Record)> = recs
        .iter()
        .zip(at)
        .map(|((_, r), (o, _))| (*o, r.clone()))
        .collect();
    v.sort_by_key(|(o, _)| *o);
    v.into_iter().map(|(_, r)| r).collect()
}

/// The order [`TraceFile`] gives a version 2 file's records: by time, an untimed record at
/// the time of its thread's timed record before it, ties in file order; only the records at
/// offsets `keep` accepts.
fn trace_order(
    recs: &[(u32, Record)],
    at: &[(u64, usize)],
    keep: impl Fn(u64, usize) -> bool,
) -> Vec<Record> {
    let mut last: std::collections::HashMap<u32, u64> = Default::default();
    let mut keyed = Vec::new();
    for ((tid, r), &(o, n)) in recs.iter().zip(at) {
        let t = last.entry(*tid).or_insert(0);
        if let Some(rt) = time_of(r) {
            *t = rt;
        }
        if keep(o, n) {
            keyed.push((*t, o, r.clone()));
        }
    }
    keyed.sort_by_key(|(t, o, _)| (*t, *o));
    keyed.into_iter().map(|(_, _, r)| r).collect()
}

#[test]
fn v2_round_trip_in_storage_and_time_order() {
    let recs = threaded_records();
    let (bytes, at, _) = block_file(&recs);
    let t = TraceFile::from_bytes("t".as_ref(), &bytes).unwrap();
    assert_eq!(t.header, v2_header());
    assert!(t.problems.is_empty(), "{:?}", t.problems);
    assert_eq!(t.records, trace_order(&recs, &at, |_, _| true));
    assert_eq!(t.driver_version, Some(13000));
    // Several blocks per thread, interleaved.
    assert!(bytes.len() > 8 * BS as usize, "{}", bytes.len());

    let (dir, path) = write_temp("stream-v2", &bytes);
    let f = FileReader::open(&path).unwrap();
    assert_eq!(f.header(), &v2_header());
    let mut all = f.records().unwrap();
    assert_eq!(
        all.by_ref().collect::<Vec<_>>(),
        in_storage_order(&recs, &at)
    );
    assert!(all.problems().is_empty());
    let mut timed = f.timed().unwrap();
    let got: Vec<Record> = timed.by_ref().collect();
    assert!(timed.problems().is_empty());
    // Time order; equal times in storage order.
    let mut want: Vec<(u64, u64, Record)> = recs
        .iter()
        .zip(&at)
        .filter_map(|((_, r), (o, _))| Some((time_of(r)?, *o, r.clone())))
        .collect();
    want.sort_by_key(|(t, o, _)| (*t, *o));
    assert_eq!(got, want.into_iter().map(|(_, _, r)| r).collect::<Vec<_>>());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn v2_events_are_compact() {
    let mut d = Deltas {
        t_ns: 1_000_000,
        ptr: 0,
    };
    let mut out = [0u8; MAX_EVENT_RECORD_LEN];
    let alloc = Event {
        t_ns: 1_000_900,
        kind: EventKind::Alloc,
        api: Api(1),
        ptr: 0x7f3a_2000_0000,
        size: 1 << 20,
        stack: 5,
        ..Event::default()
    };
    let n_alloc = encode_event(&alloc, &mut d, &mut out);
    let free = Event {
        t_ns: 1_001_300,
        kind: EventKind::Free,
        api: Api(8),
        size: 0,
        ..alloc
    };
    let n_free = encode_event(&free, &mut d, &mut out);
    // tag, length, kind|mem, flags, api, time (2), pointer (7 from 0, then 1), size (3), stack.
    assert_eq!((n_alloc, n_free), (18, 9));
    let worst = Event {
        t_ns: u64::MAX,
        tid: 1,
        device: i32::MIN,
        kind: EventKind::FreeFailed,
        mem: MemKind::Mapping,
        api: Api(u16::MAX),
        result: i32::MIN,
        ptr: 1 << 63,
        size: u64::MAX,
        stream: u64::MAX,
        aux: u64::MAX,
        free_bytes: u64::MAX,
        total_bytes: u64::MAX,
        stack: u32::MAX,
        label: u32::MAX,
    };
    let mut d = Deltas::default();
    assert!(encode_event(&worst, &mut d, &mut out) <= MAX_EVENT_RECORD_LEN);
    let mut w = BlockFileWriter::new(&header(), BS);
    w.push(1, &Record::Event(worst)).unwrap();
    let t = TraceFile::from_bytes("t".as_ref(), &w.finish()).unwrap();
    assert_eq!(t.records, vec![Record::Event(worst)]);
}

/// The writer stores a record's length and payload first and its tag last, so a kill at any
/// moment leaves either the whole record or none of it: kill the writer after every single
/// byte store and read back.
#[test]
fn v2_a_record_cut_at_every_byte_is_never_misread() {
    let recs = threaded_records();
    let recs = &recs[..120];
    let (bytes, at, before) = block_file(recs);
    for (i, &(off, len)) in at.iter().enumerate() {
        let off = off as usize;
        let prev = &before[i];
        let whole = trace_order(&recs[..i], &at[..i], |_, _| true);
        // The record starts a block: its header is stored first (magic last).
        let starts_block = (off - 4096) % BS as usize == BLOCK_HEADER_LEN;
        let mut states: Vec<Vec<u8>> = Vec::new();
        if starts_block {
            let block = off - BLOCK_HEADER_LEN;
            for k in 4..BLOCK_HEADER_LEN {
                let mut s = prev.clone();
                s.resize(s.len().max(block + BS as usize), 0);
                s[block + 4..block + k].copy_from_slice(&bytes[block + 4..block + k]);
                states.push(s);
            }
        }
        for k in 1..len {
            let mut s = prev.clone();
            s.resize(s.len().max(off + len), 0);
            if starts_block {
                let block = off - BLOCK_HEADER_LEN;
                s[block..off].copy_from_slice(&bytes[block..off]);
            }
            s[off + 1..off + k + 1].copy_from_slice(&bytes[off + 1..off + k + 1]);
            states.push(s);
        }
        for s in states {
            let t = TraceFile::from_bytes("t".as_ref(), &s).unwrap();
            assert_eq!(t.records, whole, "record {i}");
            assert!(
                t.problems
                    .iter()
                    .all(|p| matches!(p, Problem::TornTail { .. }))
                    && t.problems.len() <= 1,
                "record {i}: {:?}",
                t.problems
            );
        }
    }
}

/// A file cut short at any byte (a copy interrupted, a disk full) gives exactly the records
/// wholly inside it.
#[test]
fn v2_truncation_at_every_byte_never_misreads() {
    let recs = threaded_records();
    let recs = &recs[..60];
    let (bytes, at, _) = block_file(recs);
    let mut hdr = Vec::new();
    let data = header().encode_blocks(BS, &mut hdr) as usize;
    let mut order: Vec<(u64, usize, Record)> = recs
        .iter()
        .zip(&at)
        .map(|((_, r), (o, n))| (*o, *n, r.clone()))
        .collect();
    order.sort_by_key(|(o, _, _)| *o);
    for cut in 0..=bytes.len() {
        match TraceFile::from_bytes("t".as_ref(), &bytes[..cut]) {
            Err(ReadError::Header(_, HeaderError::Truncated)) => assert!(cut < hdr.len()),
            Err(e) => panic!("cut at {cut}: {e}"),
            Ok(t) => {
                let want = trace_order(recs, &at, |o, n| o as usize + n <= cut);
                assert_eq!(t.records, want, "cut at {cut}");
                assert!(
                    t.problems
                        .iter()
                        .all(|p| matches!(p, Problem::TornTail { .. })),
                    "cut at {cut}: {:?}",
                    t.problems
                );
                if cut <= data {
                    assert!(t.problems.is_empty());
                }
            }
        }
    }
}

#[test]
fn v2_a_bad_block_is_reported_and_skipped() {
    let recs = threaded_records();
    let (mut bytes, at, _) = block_file(&recs);
    // Break the second block's magic and the third's checksum.
    let data = 4096;
    bytes[data + BS as usize] ^= 0x55;
    bytes[data + 2 * BS as usize + 9] ^= 0x01;
    let bad =
        |o: u64| (o as usize - data) / BS as usize == 1 || (o as usize - data) / BS as usize == 2;
    let want: Vec<Record> = {
        let kept: Vec<(u32, Record)> = recs
            .iter()
            .zip(&at)
            .filter(|(_, (o, _))| !bad(*o))
            .map(|(r, _)| r.clone())
            .collect();
        let kept_at: Vec<(u64, usize)> = at.iter().filter(|(o, _)| !bad(*o)).copied().collect();
        in_storage_order(&kept, &kept_at)
    };
    let t = TraceFile::from_bytes("t".as_ref(), &bytes).unwrap();
    let sorted = |v: &[Record]| {
        let mut v: Vec<String> = v.iter().map(|r| format!("{r:?}")).collect();
        v.sort();
        v
    };
    assert_eq!(sorted(&t.records), sorted(&want));
    assert_eq!(
        t.problems,
        vec![
            Problem::BadBlock {
                offset: (data + BS as usize) as u64,
                bytes: BS as u64
            },
            Problem::BadBlock {
                offset: (data + 2 * BS as usize) as u64,
                bytes: BS as u64
            },
        ]
    );
    let (dir, path) = write_temp("bad-block", &bytes);
    let f = FileReader::open(&path).unwrap();
    let mut timed = f.timed().unwrap();
    assert_eq!(
        timed.by_ref().count(),
        want.iter().filter(|r| time_of(r).is_some()).count()
    );
    assert_eq!(timed.problems().len(), 2);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Follow a version 2 file as the preload writes it: space reserved (zeros) ahead, then each
/// record's bytes stored one at a time, the tag last.
#[test]
fn follower_reads_a_growing_v2_file_store_by_store() {
    use std::os::unix::fs::FileExt;
    let recs = threaded_records();
    let recs = &recs[..150];
    let (bytes, at, _) = block_file(recs);
    let dir = std::env::temp_dir().join(format!("vramtrace-format-follow2-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("1.vtr");
    let f = std::fs::File::create(&path).unwrap();
    let mut follower = Follower::open(&path).unwrap();
    assert!(follower.poll().unwrap().0.is_empty());
    f.write_all_at(&bytes[..4096], 0).unwrap();
    f.set_len(bytes.len() as u64).unwrap(); // reserved ahead
    let mut got = Vec::new();
    let mut poll = |follower: &mut Follower| {
        let (r, p) = follower.poll().unwrap();
        assert!(p.is_empty(), "{p:?}");
        got.extend(r);
    };
    poll(&mut follower);
    for (i, &(off, len)) in at.iter().enumerate() {
        let off = off as usize;
        if (off - 4096) % BS as usize == BLOCK_HEADER_LEN {
            let block = off - BLOCK_HEADER_LEN;
            f.write_all_at(&bytes[block + 4..off], (block + 4) as u64)
                .unwrap();
            poll(&mut follower);
            f.write_all_at(&bytes[block..block + 4], block as u64)
                .unwrap();
        }
        for k in (1..len).step_by(3) {
            f.write_all_at(
                &bytes[off + k..(off + k + 3).min(off + len)],
                (off + k) as u64,
            )
            .unwrap();
            if i % 7 == 0 {
                poll(&mut follower);
            }
        }
        f.write_all_at(&bytes[off..off + 1], off as u64).unwrap();
        if i % 3 == 0 {
            poll(&mut follower);
        }
    }
    poll(&mut follower);
    assert_eq!(follower.header(), Some(&v2_header()));
    // Each thread's records in its order, all of them once.
    for tid in [11, 12, 13] {
        let mine = |r: &&Record| match r {
            Record::Event(e) => e.tid == tid,
            Record::Annotate(a) => a.tid == tid,
            Record::RangePush { tid: t, .. }
            | Record::RangePop { tid: t, .. }
            | Record::Mark { tid: t, .. } => *t == tid,
            _ => false,
        };
        let want: Vec<&Record> = recs
            .iter()
            .filter(|(t, _)| *t == tid)
            .map(|(_, r)| r)
            .filter(mine)
            .collect();
        assert_eq!(
            got.iter().filter(mine).collect::<Vec<_>>(),
            want,
            "thread {tid}"
        );
    }
    assert_eq!(got.len(), recs.len());
    std::fs::remove_dir_all(&dir).unwrap();
}
