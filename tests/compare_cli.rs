//! `vramtrace compare` on a synthetic trace whose allocations are fla 0.6.0's at T=4128, H=48,
//! K=V=128 bf16 (the sizes docs/architecture.md records as measured), plus an unnamed input.

mod common;

use common::*;
use vramtrace_format::{Api, Event, EventKind, Header, MemKind, Record};

const FLA: [u64; 8] = [
    792576, 25362432, 50724864, 50724864, 102236160, 3145728, 50724864, 50724864,
];

fn write_trace(dir: &std::path::Path, fail_last: bool) {
    let mut bytes = Vec::new();
    Header {
        version: 1,
        pid: 77,
        ppid: 1,
        cmdline: vec!["python3".into()],
        ..Header::default()
    }
    .encode(&mut bytes);
    let mut buf = vec![0u8; 256];
    let mut t = 1000;
    let mut push = |bytes: &mut Vec<u8>, r: Record| bytes.extend_from_slice(r.encode(&mut buf));
    // An input (v) allocated first, then the kernel's tensors in order.
    let mut sizes = vec![50724864u64];
    sizes.extend(FLA);
    for (i, s) in sizes.iter().enumerate() {
        t += 10;
        let failed = fail_last && i == sizes.len() - 1;
        push(
            &mut bytes,
            Record::Event(Event {
                t_ns: t,
                tid: 1,
                device: 0,
                kind: if failed {
                    EventKind::AllocFailed
                } else {
                    EventKind::Alloc
                },
                mem: MemKind::Device,
                api: Api::from_name("cuMemAlloc_v2").unwrap(),
                result: if failed { 2 } else { 0 },
                ptr: if failed {
                    0
                } else {
                    0x7000_0000_0000 + i as u64 * (1 << 28)
                },
                size: *s,
                free_bytes: if failed { 30 << 20 } else { 0 },
                total_bytes: if failed { 24 << 30 } else { 0 },
                ..Event::default()
            }),
        );
    }
    std::fs::write(dir.join("77.vtr"), bytes).unwrap();
}

#[test]
fn peak_is_attributed_tensor_by_tensor() {
    let dir = scratch("compare-peak");
    write_trace(&dir, false);
    let o = compare_fla(&dir, &["--json"]);
    assert!(o.status.success(), "{}", describe(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let rows = v["attribution"]["rows"].as_array().unwrap();
    // The unnamed input is a fifth live allocation of 50724864 bytes: w, u, v_new and o rest on
    // size alone among 5 look-alikes for 4 tensors, so they are ambiguous, not matched; the
    // tensors of a size nothing else has are matched, on size and order alone.
    for (r, &b) in rows.iter().zip(&FLA) {
        assert_eq!(r["predicted_bytes"], b);
        if b == 50724864 {
            assert!(r["observed"].is_null(), "{r}");
            assert_eq!(r["evidence"]["kind"], "ambiguous", "{r}");
            assert_eq!(r["evidence"]["candidates"], 5, "{r}");
        } else {
            assert_eq!(r["observed_bytes"], b, "{r}");
            assert_eq!(r["difference"], 0, "{r}");
            assert_eq!(r["evidence"]["kind"], "size_only", "{r}");
        }
    }
    let unique: u64 = FLA.iter().filter(|&&b| b != 50724864).sum();
    assert_eq!(v["attribution"]["attributed_bytes"], unique);
    assert_eq!(v["attribution"]["evidence"]["evidence_bytes"], 0);
    assert_eq!(v["attribution"]["evidence"]["size_only_bytes"], unique);
    assert_eq!(v["attribution"]["evidence"]["ambiguous"], 4);
    assert_eq!(
        v["attribution"]["unexplained_bytes"],
        5 * 50724864u64,
        "the input and the four look-alikes"
    );
    let text = compare_fla(&dir, &[]);
    let s = String::from_utf8_lossy(&text.stdout);
    assert!(s.contains("ambiguous"), "{s}");
}

#[test]
fn failed_request_is_named() {
    let dir = scratch("compare-oom");
    write_trace(&dir, true);
    let o = compare_fla(&dir, &["--at", "oom"]);
    assert!(o.status.success(), "{}", describe(&o));
    let s = String::from_utf8_lossy(&o.stdout);
    assert!(
        s.contains("the failed request is o bfloat16 [1, 4128, 48, 128]"),
        "{s}"
    );
    let bad = compare_fla(&dir, &["--at", "oom:3"]);
    assert_eq!(bad.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&bad.stderr).contains("there is no failure #3"),
        "{}",
        describe(&bad)
    );
}
