//! Labels through the real preload: the annotation C ABI (`include/vramtrace.h`), per-thread
//! ranges, marks, and labels that survive a fork.

mod common;

use std::process::Command;

use common::*;
use vramtrace_format::{EventKind, Record, TraceFile};

fn ptr_of(out: &str, name: &str) -> u64 {
    num(lines(out, name)[0][0])
}

fn label_of(t: &TraceFile, ptr: u64) -> Option<String> {
    let e = events(t)
        .into_iter()
        .find(|e| e.kind == EventKind::Alloc && e.ptr == ptr)
        .unwrap_or_else(|| panic!("no allocation of {ptr:#x}"));
    string(t, e.label)
}

#[test]
fn ranges_marks_and_annotations() {
    let s = Scratch::new("labels");
    let exe = compile(&s, "labels", true);
    let out = run_ok(traced(&exe, &s.trace_dir()));
    let l = &lines(&out, "parent")[0];
    let (parent, child) = (num(l[0]) as u32, num(l[2]) as u32);
    let all = traces(&s.trace_dir());
    assert_eq!(all.len(), 2);
    let t = all.iter().find(|t| t.header.pid == parent).unwrap();
    let c = all.iter().find(|t| t.header.pid == child).unwrap();
    assert!(t.problems.is_empty() && c.problems.is_empty());

    // Labels: the thread's open ranges joined by "/", none outside ranges, per thread.
    assert_eq!(
        label_of(t, ptr_of(&out, "A")).as_deref(),
        Some("prefill/layer.0")
    );
    assert_eq!(label_of(t, ptr_of(&out, "B")).as_deref(), Some("prefill"));
    assert_eq!(label_of(t, ptr_of(&out, "C")), None);
    assert_eq!(
        label_of(t, ptr_of(&out, "D")).as_deref(),
        Some("worker"),
        "another thread's ranges are its own"
    );
    // The fork child writes its own strings: its label resolves in its own file.
    assert_eq!(label_of(c, ptr_of(&out, "E")).as_deref(), Some("forked"));

    // Annotations: name, dtype, shape of the allocation at that pointer.
    let anns: Vec<_> = t
        .records
        .iter()
        .filter_map(|r| match r {
            Record::Annotate(a) => Some(a.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(anns.len(), 2);
    assert_eq!(anns[0].ptr, ptr_of(&out, "A"));
    assert_eq!(string(t, anns[0].name).as_deref(), Some("q"));
    assert_eq!(string(t, anns[0].dtype).as_deref(), Some("bf16"));
    assert_eq!(anns[0].shape, vec![4128, 16, 128]);
    assert_eq!(anns[1].ptr, ptr_of(&out, "C"));
    assert_eq!(string(t, anns[1].name).as_deref(), Some("scratch"));
    assert_eq!((anns[1].dtype, anns[1].shape.len()), (0, 0));
    assert_eq!(anns[0].tid, t.header.pid);

    // Range records: pushes and pops balance, each push names its range.
    let pushes: Vec<String> = t
        .records
        .iter()
        .filter_map(|r| match r {
            Record::RangePush { name, .. } => string(t, *name),
            _ => None,
        })
        .collect();
    assert_eq!(pushes, vec!["prefill", "layer.0", "worker", "forked"]);
    let pops = t
        .records
        .iter()
        .filter(|r| matches!(r, Record::RangePop { .. }))
        .count();
    assert_eq!(pops, 4);
    let marks: Vec<String> = t
        .records
        .iter()
        .filter_map(|r| match r {
            Record::Mark { name, .. } => string(t, *name),
            _ => None,
        })
        .collect();
    assert_eq!(marks, vec!["done"]);
    // Every string is written once.
    let mut ids: Vec<u32> = t
        .records
        .iter()
        .filter_map(|r| match r {
            Record::String { id, .. } => Some(*id),
            _ => None,
        })
        .collect();
    let n = ids.len();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), n);
}

#[test]
fn the_helpers_are_no_ops_without_the_preload() {
    let s = Scratch::new("labels-bare");
    let exe = compile(&s, "labels", true);
    let mut bare = Command::new(&exe);
    bare.env("LD_LIBRARY_PATH", driver_dir())
        .env_remove("LD_PRELOAD")
        .env("VRAMTRACE_DIR", s.trace_dir());
    let out = run_ok(bare);
    assert_eq!(lines(&out, "A").len(), 1);
    assert!(!s.trace_dir().exists());
}
