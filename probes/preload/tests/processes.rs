//! Every process that inherits the preload writes its own file, linked to its parent by ppid:
//! posix_spawn, fork + exec, and Python multiprocessing's spawn start method. (Plain fork is in
//! tests/capture.rs.)

mod common;

use std::path::Path;

use common::*;
use vramtrace_format::{EventKind, TraceFile};

fn alloc_sizes(t: &TraceFile) -> Vec<u64> {
    events(t)
        .iter()
        .filter(|e| e.kind == EventKind::Alloc)
        .map(|e| e.size)
        .collect()
}

#[test]
fn posix_spawn_and_exec_children_write_their_own_files() {
    let s = Scratch::new("spawn");
    let exe = compile(&s, "spawn", true);
    let out = run_ok(traced(&exe, &s.trace_dir()));
    let l = &lines(&out, "parent")[0];
    let (parent, spawned, execed) = (num(l[0]) as u32, num(l[2]) as u32, num(l[4]) as u32);
    let all = traces(&s.trace_dir());
    assert_eq!(all.len(), 3, "one file per process");
    let by_pid = |pid| all.iter().find(|t| t.header.pid == pid).unwrap();
    assert_eq!(alloc_sizes(by_pid(parent)), vec![1000]);
    for (pid, size, how) in [(spawned, 7777, "posix_spawn"), (execed, 8888, "exec")] {
        let t = by_pid(pid);
        assert_eq!(t.header.ppid, parent, "{how} child names its parent");
        assert_eq!(alloc_sizes(t), vec![size], "{how}");
        assert_eq!(t.header.cmdline[1], size.to_string());
        assert!(t.problems.is_empty());
    }
}

#[test]
fn python_multiprocessing_spawn_workers() {
    let s = Scratch::new("mp-spawn");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/py/mp_spawn.py");
    let mut cmd = traced(Path::new("python3"), &s.trace_dir());
    cmd.arg(&script);
    let out = run_ok(cmd);
    let parent = num(lines(&out, "parent")[0][0]) as u32;
    let workers = lines(&out, "worker");
    assert_eq!(workers.len(), 2, "{out}");
    let all = traces(&s.trace_dir());
    assert_eq!(
        all.len(),
        2,
        "one file per worker; the parent and the resource tracker never touch CUDA"
    );
    for w in workers {
        let t = all
            .iter()
            .find(|t| t.header.pid == num(w[0]) as u32)
            .expect("a file for each worker");
        assert_eq!(t.header.ppid, parent);
        let e = events(t)
            .into_iter()
            .find(|e| e.kind == EventKind::Alloc)
            .unwrap();
        assert_eq!((e.ptr, e.size), (num(w[1]), num(w[2])));
        assert!(t.header.cmdline[0].contains("python"));
    }
}
