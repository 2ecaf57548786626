//! Issue 13: one flipped byte in a file header must not discard the file. Every byte of a real
//! version 2 header (and of a version 1 one) is flipped in turn: the file is either read whole
//! with a `DamagedHeader` problem, or refused with a clear reason (magic and version bytes).

use std::path::{Path, PathBuf};

use vramtrace_format::{
    FileReader, Header, HeaderError, Problem, ReadError, Record, STREAM_VERSION, TraceFile,
};

fn sample() -> Vec<u8> {
    let p =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../samples/h200/v2-torch-nocache/589.vtr");
    std::fs::read(p).unwrap()
}

/// Length of the header as written: magic, version, flags, body length, body, checksum.
fn header_len(bytes: &[u8]) -> usize {
    16 + u32::from_le_bytes(bytes[12..16].try_into().unwrap()) as usize + 4
}

fn is_damage(p: &Problem) -> bool {
    matches!(p, Problem::DamagedHeader { .. })
}

/// Checks one flipped file read from memory; returns whether it was read.
fn check_flip(good: &TraceFile, bytes: &[u8], at: usize) -> bool {
    match TraceFile::from_bytes(Path::new("flipped.vtr"), bytes) {
        Ok(t) => {
            assert!(at >= 10, "byte {at}: a bad magic or version was accepted");
            assert_eq!(t.records, good.records, "byte {at}: records differ");
            let rest: Vec<_> = t.problems.iter().filter(|p| !is_damage(p)).collect();
            let want: Vec<_> = good.problems.iter().collect();
            assert_eq!(rest, want, "byte {at}: other problems differ");
            // The flags are not covered by the checksum: a flip there reads cleanly.
            if !(10..12).contains(&at) {
                assert!(
                    t.problems.iter().any(is_damage),
                    "byte {at}: no DamagedHeader"
                );
                assert!(
                    t.problems[0].to_string().contains("checksum"),
                    "{}",
                    t.problems[0]
                );
            }
            if t.header.version == good.header.version && !(16..24).contains(&at) {
                // Bytes outside pid/ppid leave them right.
                assert_eq!(t.header.pid, good.header.pid, "byte {at}");
            }
            true
        }
        Err(ReadError::Header(_, e)) => {
            match at {
                0..8 => assert_eq!(e, HeaderError::NotATrace, "byte {at}"),
                8..10 => assert!(
                    matches!(e, HeaderError::UnsupportedVersion(_)),
                    "byte {at}: {e}"
                ),
                _ => panic!("byte {at}: refused: {e}"),
            }
            assert!(!e.to_string().is_empty());
            false
        }
        Err(e) => panic!("byte {at}: {e}"),
    }
}

#[test]
fn every_flipped_byte_of_a_v2_header_reads_the_records_or_names_why_not() {
    let bytes = sample();
    let good = TraceFile::from_bytes(Path::new("589.vtr"), &bytes).unwrap();
    assert!(!good.records.is_empty());
    assert!(good.problems.iter().all(|p| !is_damage(p)));
    let dir = std::env::temp_dir().join(format!("vt-damaged-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let good_stream = stream(&dir, &bytes);
    let end = header_len(&bytes);
    for mask in [0xffu8, 0x01, 0x80] {
        for at in 0..end {
            let mut b = bytes.clone();
            b[at] ^= mask;
            let read = check_flip(&good, &b, at);
            // The streaming reader agrees.
            let got = FileReader::open(&write(&dir, &b)).map(|_| stream(&dir, &b));
            assert_eq!(got.is_ok(), read, "byte {at} mask {mask:#x}");
            if let Ok((records, timed, problems)) = got {
                assert_eq!(records, good_stream.0, "byte {at} mask {mask:#x}");
                assert_eq!(timed, good_stream.1, "byte {at} mask {mask:#x}");
                if !(10..12).contains(&at) {
                    assert!(problems.iter().any(is_damage), "byte {at} mask {mask:#x}");
                }
            }
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

fn write(dir: &Path, bytes: &[u8]) -> PathBuf {
    let p = dir.join("1.vtr");
    std::fs::write(&p, bytes).unwrap();
    p
}

fn stream(dir: &Path, bytes: &[u8]) -> (usize, usize, Vec<Problem>) {
    let r = FileReader::open(&write(dir, bytes)).unwrap();
    let mut records = r.records().unwrap();
    let n = records.by_ref().count();
    let mut timed = r.timed().unwrap();
    let t = timed.by_ref().count();
    let mut problems = records.problems().to_vec();
    problems.extend(timed.problems().iter().cloned());
    (n, t, problems)
}

#[test]
fn layout_fields_that_make_no_sense_fall_back_to_scanning_for_blocks() {
    let mut bytes = sample();
    let good = TraceFile::from_bytes(Path::new("589.vtr"), &bytes).unwrap();
    // The block size and data offset are the last 12 bytes of the body.
    let end = header_len(&bytes);
    for b in &mut bytes[end - 16..end - 4] {
        *b = 0x5a;
    }
    let t = TraceFile::from_bytes(Path::new("x.vtr"), &bytes).unwrap();
    assert_eq!(t.records, good.records);
    assert!(matches!(
        t.problems[0],
        Problem::DamagedHeader { scanned: true, .. }
    ));
    assert_eq!(t.header.cmdline, good.header.cmdline);
    assert!(t.problems[0].to_string().contains("scanning"));
}

#[test]
fn every_flipped_byte_of_a_v1_header_reads_the_records_or_names_why_not() {
    let h = Header {
        version: STREAM_VERSION,
        pid: 77,
        ppid: 1,
        start_unix_ns: 5,
        start_mono_ns: 6,
        hostname: "host".into(),
        cmdline: vec!["python3".into(), "x.py".into()],
    };
    let mut bytes = Vec::new();
    h.encode(&mut bytes);
    let end = bytes.len();
    let mut buf = vec![0u8; 70_000];
    for i in 0..50u64 {
        let r = Record::Mark {
            t_ns: i,
            tid: 1,
            name: i as u32,
        };
        bytes.extend_from_slice(r.encode(&mut buf));
    }
    let good = TraceFile::from_bytes(Path::new("v1.vtr"), &bytes).unwrap();
    assert_eq!(good.records.len(), 50);
    for at in 0..end {
        let mut b = bytes.clone();
        b[at] ^= 0xff;
        check_flip(&good, &b, at);
    }
}
