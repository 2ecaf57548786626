//! Native stacks through the real preload: captured from `.eh_frame` in a program built without
//! frame pointers, de-duplicated into the STACK table, with MODULE records that locate every
//! frame in its file.

mod common;

use std::path::Path;
use std::process::Command;

use common::*;
use vramtrace_format::{EventKind, ModuleInfo, Record, TraceFile};

/// `(start, end, name)` of the program's function symbols, from `nm -S`.
fn functions(exe: &Path) -> Vec<(u64, u64, String)> {
    let o = Command::new("nm")
        .args(["-S", "--defined-only"])
        .arg(exe)
        .output()
        .expect("running nm");
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() == 4 && (f[2] == "T" || f[2] == "t")).then(|| {
                let start = u64::from_str_radix(f[0], 16).unwrap();
                let size = u64::from_str_radix(f[1], 16).unwrap();
                (start, start + size, f[3].to_string())
            })
        })
        .collect()
}

fn modules(t: &TraceFile) -> Vec<ModuleInfo> {
    t.records
        .iter()
        .filter_map(|r| match r {
            Record::Module(m) => Some(m.clone()),
            _ => None,
        })
        .collect()
}

fn stack(t: &TraceFile, id: u32) -> Vec<u64> {
    t.records
        .iter()
        .find_map(|r| match r {
            Record::Stack { id: i, frames } if *i == id => Some(frames.clone()),
            _ => None,
        })
        .unwrap_or_else(|| panic!("no STACK record {id}"))
}

/// The module and function (for the program's own frames) of a return address.
fn locate(addr: u64, mods: &[ModuleInfo], exe: &Path, funcs: &[(u64, u64, String)]) -> String {
    let Some(m) = mods.iter().find(|m| m.start <= addr && addr < m.end) else {
        return "?".into();
    };
    let file = Path::new(&m.path).file_name().unwrap().to_string_lossy();
    if Path::new(&m.path) != exe {
        return file.into_owned();
    }
    let svma = addr - 1 - m.bias; // inside the call instruction
    funcs
        .iter()
        .find(|(s, e, _)| *s <= svma && svma < *e)
        .map(|(_, _, n)| n.clone())
        .unwrap_or_else(|| format!("{file}+{svma:#x}"))
}

#[test]
fn stacks_name_the_programs_own_functions() {
    let s = Scratch::new("stacks");
    let exe = compile_with(
        &s,
        "stacks",
        true,
        &["-fomit-frame-pointer", "-fno-optimize-sibling-calls"],
    );
    run_ok(traced(&exe, &s.trace_dir()));
    let t = only_trace(&s.trace_dir());
    let mods = modules(&t);
    let funcs = functions(&exe);
    let exe_mod = mods
        .iter()
        .find(|m| Path::new(&m.path) == exe)
        .expect("a MODULE record for the program");
    assert!(!exe_mod.build_id.is_empty(), "the program's build id");
    assert!(exe_mod.bias > 0, "a PIE program is loaded with a bias");
    assert!(
        mods.iter()
            .any(|m| m.path.ends_with("libvramtrace_preload.so"))
    );

    let allocs: Vec<_> = events(&t)
        .into_iter()
        .filter(|e| e.kind == EventKind::Alloc)
        .collect();
    assert_eq!(allocs.len(), 4);
    // One call site, one stack; another call site, another stack.
    let ids: Vec<u32> = allocs.iter().map(|e| e.stack).collect();
    assert!(ids.iter().all(|&i| i != 0), "{ids:?}");
    assert_eq!(
        (ids[0], ids[1]),
        (ids[2], ids[0]),
        "{:x?}",
        ids.iter().map(|&i| stack(&t, i)).collect::<Vec<_>>()
    );
    assert_ne!(ids[3], ids[0]);
    let stack_records = t
        .records
        .iter()
        .filter(|r| matches!(r, Record::Stack { .. }))
        .count();
    let distinct: std::collections::HashSet<u32> = events(&t)
        .iter()
        .map(|e| e.stack)
        .filter(|&s| s != 0)
        .collect();
    assert_eq!(stack_records, distinct.len(), "each stack written once");
    // Releases get no stack unless asked for (VRAMTRACE_FREE_STACKS).
    assert!(
        events(&t)
            .iter()
            .filter(|e| e.kind == EventKind::Free)
            .all(|e| e.stack == 0)
    );

    // Frame 0 is in the preload; then the program's functions, innermost first.
    let through_outer = stack(&t, ids[0]);
    let names: Vec<String> = through_outer[1..]
        .iter()
        .map(|&a| locate(a, &mods, &exe, &funcs))
        .collect();
    assert!(
        mods.iter()
            .find(|m| m.start <= through_outer[0] && through_outer[0] < m.end)
            .is_some_and(|m| m.path.ends_with("libvramtrace_preload.so")),
        "frame 0 is the recorder's own"
    );
    assert_eq!(
        names[..3],
        ["vramtrace_test_inner", "vramtrace_test_outer", "main"],
        "{names:?}"
    );
    assert!(names.iter().any(|n| n.starts_with("libc.so")), "{names:?}");
    let direct = stack(&t, ids[3]);
    let names: Vec<String> = direct[1..]
        .iter()
        .map(|&a| locate(a, &mods, &exe, &funcs))
        .collect();
    assert_eq!(names[..2], ["vramtrace_test_inner", "main"], "{names:?}");
}

#[test]
fn releases_get_stacks_when_asked() {
    let s = Scratch::new("free-stacks");
    let exe = compile(&s, "stacks", true);
    let mut cmd = traced(&exe, &s.trace_dir());
    cmd.env("VRAMTRACE_FREE_STACKS", "1");
    run_ok(cmd);
    let t = only_trace(&s.trace_dir());
    let evs = events(&t);
    let frees: Vec<_> = evs.iter().filter(|e| e.kind == EventKind::Free).collect();
    assert_eq!(frees.len(), 4);
    assert!(frees.iter().all(|e| e.stack != 0));
    let alloc_stacks: Vec<u32> = evs
        .iter()
        .filter(|e| e.kind == EventKind::Alloc)
        .map(|e| e.stack)
        .collect();
    assert!(!alloc_stacks.contains(&frees[0].stack), "another call site");
    assert_eq!(
        stack(&t, frees[0].stack).len(),
        stack(&t, frees[3].stack).len()
    );
}

#[test]
fn stacks_can_be_switched_off() {
    let s = Scratch::new("stacks-off");
    let exe = compile(&s, "stacks", true);
    let mut cmd = traced(&exe, &s.trace_dir());
    cmd.env("VRAMTRACE_STACKS", "0");
    run_ok(cmd);
    let t = only_trace(&s.trace_dir());
    assert!(events(&t).iter().all(|e| e.stack == 0));
    assert!(
        !t.records
            .iter()
            .any(|r| matches!(r, Record::Stack { .. } | Record::Module(_)))
    );
    assert_eq!(events(&t).len(), 8);
}

#[test]
fn a_library_loaded_later_gets_its_module_record() {
    let s = Scratch::new("late-load");
    let lib = compile_shared(&s, "late_lib");
    let exe = compile(&s, "late_load", true);
    let mut cmd = traced(&exe, &s.trace_dir());
    cmd.arg(&lib);
    let out = run_ok(cmd);
    let t = only_trace(&s.trace_dir());
    let late_module = t
        .records
        .iter()
        .position(|r| matches!(r, Record::Module(m) if Path::new(&m.path) == lib))
        .expect("a MODULE record for the library loaded later");
    let first_stack = t
        .records
        .iter()
        .position(|r| matches!(r, Record::Stack { .. }))
        .unwrap();
    assert!(
        late_module > first_stack,
        "written when the library appeared, after the first stack"
    );
    let ptr = num(lines(&out, "late")[0][0]);
    let e = events(&t)
        .into_iter()
        .find(|e| e.kind == EventKind::Alloc && e.ptr == ptr)
        .unwrap();
    let mods = modules(&t);
    let funcs = functions(&lib);
    let names: Vec<String> = stack(&t, e.stack)[1..]
        .iter()
        .map(|&a| locate(a, &mods, &lib, &funcs))
        .collect();
    assert_eq!(names[0], "vramtrace_late_alloc", "{names:?}");
    assert!(names.contains(&"late_load".to_string()), "{names:?}");
}
