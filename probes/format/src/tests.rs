use super::*;
use std::io::Write;

fn header() -> Header {
    Header {
        version: VERSION,
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
