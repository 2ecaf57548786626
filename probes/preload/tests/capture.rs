//! End-to-end capture through the real preload on the stand-in driver, for every way a program
//! reaches the driver.

mod common;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::Stdio;

use common::*;
use vramtrace_format::{Api, Event, EventKind, MemKind, Problem, Record};

fn api(name: &str) -> Api {
    Api::from_name(name).unwrap()
}

fn find<'a>(evs: &'a [Event], kind: EventKind, api_name: &str, ptr: u64) -> &'a Event {
    evs.iter()
        .find(|e| e.kind == kind && e.api == api(api_name) && e.ptr == ptr)
        .unwrap_or_else(|| panic!("no {kind:?} {api_name} of {ptr:#x} in {evs:#?}"))
}

/// Checks the failed allocation the program reported ("failed result size free total").
fn assert_failure(evs: &[Event], stdout: &str, api_name: &str) {
    let f = &lines(stdout, "failed")[0];
    let failed: Vec<&Event> = evs
        .iter()
        .filter(|e| e.kind == EventKind::AllocFailed)
        .collect();
    assert_eq!(failed.len(), 1, "{failed:#?}");
    let e = failed[0];
    assert_eq!(e.api, api(api_name));
    assert_eq!(e.result as u64, num(f[0]), "result code passed through");
    assert_eq!(e.result, 2, "CUDA_ERROR_OUT_OF_MEMORY");
    assert_eq!(e.size, num(f[1]));
    assert_eq!(e.free_bytes, num(f[2]), "free memory at the failure");
    assert_eq!(e.total_bytes, num(f[3]));
    assert_eq!(e.ptr, 0);
    assert_eq!(e.device, 0);
}

#[test]
fn linked_program_every_entry_point() {
    let s = Scratch::new("every-api");
    let exe = compile(&s, "every_api", true);
    let mut cmd = traced(&exe, &s.trace_dir());
    cmd.env("VRAMTRACE_FAKE_DEVICES", "2")
        .env("VRAMTRACE_FAKE_CAPACITY", "1073741824");
    let out = run_ok(cmd);
    let t = only_trace(&s.trace_dir());
    let evs = events(&t);

    // Header and the driver/device records.
    assert_eq!(t.header.cmdline, vec![exe.to_string_lossy().into_owned()]);
    assert!(t.header.start_unix_ns > 0 && t.header.start_mono_ns > 0);
    assert!(
        t.driver_version.is_some_and(|v| v >= 12000),
        "{:?}",
        t.driver_version
    );
    let ordinals: Vec<i32> = t.devices.iter().map(|d| d.ordinal).collect();
    assert_eq!(ordinals, vec![0, 1], "a DEVICE record for each device used");
    assert!(
        t.devices
            .iter()
            .all(|d| d.total_bytes == 1 << 30 && !d.name.is_empty())
    );
    // Device records come before the first event on their device.
    let first_dev1_event = t
        .records
        .iter()
        .position(|r| matches!(r, Record::Event(e) if e.device == 1))
        .unwrap();
    let dev1_record = t
        .records
        .iter()
        .position(|r| matches!(r, Record::Device(d) if d.ordinal == 1))
        .unwrap();
    assert!(dev1_record < first_dev1_event);

    let stream = num(lines(&out, "stream")[0][0]);
    // Every allocation the program printed, with its exact size, kind, device and operands.
    let expect: &[(&str, MemKind, i32)] = &[
        ("cuMemAlloc_v2", MemKind::Device, 0),
        ("cuMemAllocPitch_v2", MemKind::Device, 0),
        ("cuMemAllocManaged", MemKind::Managed, 0),
        ("cuMemAllocAsync", MemKind::Device, 0),
        ("cuMemAllocFromPoolAsync", MemKind::Device, 0),
        ("cuMemAddressReserve", MemKind::Address, 0),
        ("cuMemCreate", MemKind::Device, 1),
        ("cuMemAllocHost_v2", MemKind::Host, -1),
        ("cuMemHostAlloc", MemKind::Host, -1),
        ("cuArrayCreate_v2", MemKind::Array, 0),
        ("cuArray3DCreate_v2", MemKind::Array, 0),
    ];
    for &(name, mem, device) in expect {
        let l = &lines(&out, name)[0];
        let e = find(&evs, EventKind::Alloc, name, num(l[0]));
        assert_eq!(e.size, num(l[1]), "{name} size");
        assert_eq!(e.mem, mem, "{name} memory kind");
        assert_eq!(e.device, device, "{name} device");
        assert_eq!(e.result, 0);
        assert!(e.t_ns >= t.header.start_mono_ns);
        match name {
            "cuMemAllocPitch_v2" | "cuMemAllocManaged" | "cuMemHostAlloc" => {
                assert_eq!(e.aux, num(l[2]), "{name} aux")
            }
            "cuMemAllocFromPoolAsync" => {
                assert_eq!(e.aux, num(l[2]), "pool");
                assert_eq!(e.stream, stream);
            }
            "cuMemAllocAsync" => assert_eq!(e.stream, stream),
            _ => {}
        }
    }
    // The mapping: range, size, and the physical handle in aux.
    let m = &lines(&out, "cuMemMap")[0];
    let map = find(&evs, EventKind::Map, "cuMemMap", num(m[0]));
    assert_eq!(
        (map.size, map.aux, map.mem),
        (num(m[1]), num(m[2]), MemKind::Mapping)
    );
    let unmap = find(&evs, EventKind::Unmap, "cuMemUnmap", num(m[0]));
    assert_eq!((unmap.size, unmap.aux), (0, num(m[1])));
    // Releases: each names what it released, in the same memory family.
    for (alloc_api, free_api) in [
        ("cuMemAlloc_v2", "cuMemFree_v2"),
        ("cuMemAllocPitch_v2", "cuMemFree_v2"),
        ("cuMemAllocManaged", "cuMemFree_v2"),
        ("cuMemAllocAsync", "cuMemFreeAsync"),
        ("cuMemAllocFromPoolAsync", "cuMemFreeAsync"),
        ("cuMemAddressReserve", "cuMemAddressFree"),
        ("cuMemCreate", "cuMemRelease"),
        ("cuMemAllocHost_v2", "cuMemFreeHost"),
        ("cuMemHostAlloc", "cuMemFreeHost"),
        ("cuArrayCreate_v2", "cuArrayDestroy"),
        ("cuArray3DCreate_v2", "cuArrayDestroy"),
    ] {
        let ptr = num(lines(&out, alloc_api)[0][0]);
        let f = find(&evs, EventKind::Free, free_api, ptr);
        assert_eq!(f.size, 0);
        assert_eq!(f.result, 0);
        assert_eq!(
            f.device, -1,
            "{free_api}: the reader takes the device from {alloc_api}"
        );
    }
    let reserve = num(lines(&out, "cuMemAddressReserve")[0][1]);
    let addr_free = evs
        .iter()
        .find(|e| e.api == api("cuMemAddressFree"))
        .unwrap();
    assert_eq!(addr_free.aux, reserve, "the freed range's size in aux");
    assert_eq!(
        evs.iter()
            .filter(|e| e.kind == EventKind::Free && e.mem == MemKind::Device)
            .count(),
        6
    );
    assert_paired(
        &evs.iter()
            .filter(|e| e.kind != EventKind::AllocFailed)
            .copied()
            .collect::<Vec<_>>(),
    );
    assert_failure(&evs, &out, "cuMemAlloc_v2");
    let me = std::process::id();
    assert_ne!(t.header.pid, me);
    assert_eq!(t.header.ppid, me);
    assert!(
        evs.iter().all(|e| e.tid == t.header.pid),
        "single-threaded program"
    );
    assert!(evs.windows(2).all(|w| w[0].t_ns <= w[1].t_ns));
}

#[test]
fn dlopen_and_dlsym_get_the_wrappers() {
    let s = Scratch::new("dlopen");
    let exe = compile(&s, "dlopen_dlsym", false);
    let out = run_ok(traced(&exe, &s.trace_dir()));
    let owner = |name: &str| resolved(&out, name);
    assert_eq!(owner("cuMemAlloc_v2"), ("preload", "cuMemAlloc_v2"));
    assert_eq!(owner("cuMemFree_v2"), ("preload", "cuMemFree_v2"));
    assert_eq!(owner("cuMemHostAlloc"), ("preload", "cuMemHostAlloc"));
    assert_eq!(
        owner("cuInit").0,
        "driver",
        "functions we do not wrap stay the driver's"
    );

    let t = only_trace(&s.trace_dir());
    let evs = events(&t);
    let allocs = lines(&out, "cuMemAlloc_v2");
    assert_eq!(allocs.len(), 2);
    for l in &allocs {
        let e = find(&evs, EventKind::Alloc, "cuMemAlloc_v2", num(l[0]));
        assert_eq!((e.size, e.mem, e.device), (num(l[1]), MemKind::Device, 0));
    }
    let h = &lines(&out, "cuMemHostAlloc")[0];
    let e = find(&evs, EventKind::Alloc, "cuMemHostAlloc", num(h[0]));
    assert_eq!((e.size, e.mem, e.device), (8192, MemKind::Host, -1));
    assert_eq!(evs.len(), 6);
    assert_paired(&evs);
}

#[test]
fn cuda_runtime_style_get_proc_address() {
    let s = Scratch::new("procaddr");
    let exe = compile(&s, "procaddr", false);
    let mut cmd = traced(&exe, &s.trace_dir());
    cmd.env("VRAMTRACE_FAKE_CAPACITY", "1073741824");
    let out = run_ok(cmd);
    let owner = |name: &str| resolved(&out, name);
    // The self-lookup hands back our cuGetProcAddress_v2, so every later lookup is ours too.
    assert_eq!(
        owner("dlsym:cuGetProcAddress_v2"),
        ("preload", "cuGetProcAddress_v2")
    );
    assert_eq!(
        owner("self:cuGetProcAddress@13000"),
        ("preload", "cuGetProcAddress_v2")
    );
    // Base names with a version get the versioned wrapper; flag 2 the _ptsz twin.
    assert_eq!(owner("cuMemAlloc@13000"), ("preload", "cuMemAlloc_v2"));
    assert_eq!(owner("cuMemFree@13000"), ("preload", "cuMemFree_v2"));
    assert_eq!(
        owner("cuMemAllocAsync@13000"),
        ("preload", "cuMemAllocAsync")
    );
    assert_eq!(
        owner("cuMemAllocAsync@13000/ptsz"),
        ("preload", "cuMemAllocAsync_ptsz")
    );
    assert_eq!(
        owner("cuMemFreeAsync@13000/ptsz"),
        ("preload", "cuMemFreeAsync_ptsz")
    );
    assert_eq!(owner("cuInit@2000").0, "driver");
    assert_eq!(owner("cuMemGetInfo@13000").0, "driver");
    if let Some(old) = lines(&out, "resolved")
        .into_iter()
        .find(|l| l[0] == "self:cuGetProcAddress@11080")
    {
        // A driver that still serves the CUDA 11 lookup ABI gets the matching wrapper.
        assert_eq!((old[1], old[2]), ("preload", "cuGetProcAddress"));
    }

    let t = only_trace(&s.trace_dir());
    let evs = events(&t);
    for (name, word) in [
        ("cuMemAlloc_v2", "cuMemAlloc_v2"),
        ("cuMemAllocAsync", "cuMemAllocAsync"),
        ("cuMemAllocAsync_ptsz", "cuMemAllocAsync_ptsz"),
    ] {
        let l = &lines(&out, word)[0];
        let e = find(&evs, EventKind::Alloc, name, num(l[0]));
        assert_eq!(e.size, num(l[1]));
    }
    let c = num(lines(&out, "cuMemAllocAsync_ptsz")[0][0]);
    find(&evs, EventKind::Free, "cuMemFreeAsync_ptsz", c);
    assert_failure(&evs, &out, "cuMemAlloc_v2");
    assert_paired(
        &evs.iter()
            .filter(|e| e.kind != EventKind::AllocFailed)
            .copied()
            .collect::<Vec<_>>(),
    );
    assert!(
        !t.records.iter().any(|r| matches!(r, Record::Note { .. })),
        "the stand-in's addresses are its exports: every lookup was routed by pointer"
    );
}

#[test]
fn events_from_several_threads() {
    let s = Scratch::new("threads");
    let exe = compile(&s, "threads", true);
    run_ok(traced(&exe, &s.trace_dir()));
    let t = only_trace(&s.trace_dir());
    let evs = events(&t);
    let allocs: Vec<&Event> = evs.iter().filter(|e| e.kind == EventKind::Alloc).collect();
    assert_eq!(allocs.len(), 8 * 50);
    assert_eq!(evs.len(), 2 * 8 * 50);
    let mut tids: Vec<u32> = evs.iter().map(|e| e.tid).collect();
    tids.sort();
    tids.dedup();
    assert_eq!(tids.len(), 8, "one tid per thread");
    assert!(
        !tids.contains(&t.header.pid),
        "the main thread allocates nothing"
    );
    // Each thread's sizes are its own: thread t, round i asked for (t+1) MiB + i pages.
    let mut sizes: Vec<u64> = allocs.iter().map(|e| e.size).collect();
    sizes.sort();
    let mut want: Vec<u64> = (0..8u64)
        .flat_map(|t| (0..50u64).map(move |i| (t + 1) * (1 << 20) + i * 4096))
        .collect();
    want.sort();
    assert_eq!(sizes, want);
    for tid in tids {
        let mine: Vec<Event> = evs.iter().filter(|e| e.tid == tid).copied().collect();
        assert_eq!(mine.len(), 100);
        assert_paired(&mine);
    }
}

#[test]
fn a_program_that_never_touches_cuda_writes_nothing() {
    let s = Scratch::new("no-cuda");
    let exe = compile(&s, "no_cuda", false);
    let out = run_ok(traced(&exe, &s.trace_dir()));
    assert_eq!(out, "cos(0)=1.0\n");
    assert!(
        !s.trace_dir().exists(),
        "no trace directory, no file for a program that never touched CUDA"
    );
}

#[test]
fn switched_off_by_the_environment() {
    let s = Scratch::new("off");
    let exe = compile(&s, "dlopen_dlsym", false);
    // Recording off: the calls still reach the driver and the program sees the same results.
    let mut disabled = traced(&exe, &s.trace_dir());
    disabled.env("VRAMTRACE_DISABLE", "1");
    let out = run_ok(disabled);
    assert!(out.contains("resolved cuMemAlloc_v2 driver"), "{out}");
    assert!(!s.trace_dir().exists());
    let mut no_dir = traced(&exe, &s.trace_dir());
    no_dir.env_remove("VRAMTRACE_DIR");
    let out = run_ok(no_dir);
    assert!(out.contains("resolved cuMemAlloc_v2 driver"), "{out}");
    assert_eq!(lines(&out, "cuMemAlloc_v2").len(), 2);
    assert!(!s.trace_dir().exists());
}

#[test]
fn a_fork_child_writes_its_own_file() {
    let s = Scratch::new("fork");
    let exe = compile(&s, "fork", true);
    let out = run_ok(traced(&exe, &s.trace_dir()));
    let l = &lines(&out, "parent")[0];
    let (parent, child) = (num(l[0]) as u32, num(l[2]) as u32);
    let t = traces(&s.trace_dir());
    assert_eq!(t.len(), 2, "one file per process");
    let p = t.iter().find(|t| t.header.pid == parent).unwrap();
    let c = t.iter().find(|t| t.header.pid == child).unwrap();
    assert_eq!(c.header.ppid, parent);
    assert!(p.problems.is_empty() && c.problems.is_empty());
    let sizes = |t: &vramtrace_format::TraceFile| -> Vec<u64> {
        events(t)
            .iter()
            .filter(|e| e.kind == EventKind::Alloc)
            .map(|e| e.size)
            .collect()
    };
    assert_eq!(sizes(p), vec![1111, 3333]);
    assert_eq!(sizes(c), vec![2222]);
    assert!(events(c).iter().all(|e| e.tid == child));
    // The child's stacks resolve in its own file (its STACK and MODULE records). Its release
    // has none (VRAMTRACE_FREE_STACKS is not set).
    for e in events(c) {
        assert_eq!(e.stack == 0, e.kind == EventKind::Free);
        if e.stack == 0 {
            continue;
        }
        assert!(
            c.records
                .iter()
                .any(|r| matches!(r, Record::Stack { id, .. } if *id == e.stack))
        );
    }
    assert!(c.records.iter().any(|r| matches!(r, Record::Module(_))));
    assert!(c.driver_version.is_some() && c.devices.len() == 1);
}

#[test]
fn sigkill_while_allocating_leaves_a_readable_trace() {
    let s = Scratch::new("sigkill");
    let exe = compile(&s, "alloc_forever", true);
    let mut cmd = traced(&exe, &s.trace_dir());
    let mut child = cmd.stdout(Stdio::piped()).spawn().unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line, "ready\n");
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();

    let mut t = traces(&s.trace_dir());
    assert_eq!(t.len(), 1);
    let t = t.pop().unwrap();
    // Every complete record reads back; at most a torn last record is reported.
    assert!(t.problems.len() <= 1, "{:?}", t.problems);
    if let Some(p) = t.problems.first() {
        assert!(matches!(p, Problem::TornTail { .. }), "{p:?}");
    }
    let evs = events(&t);
    assert!(
        evs.len() >= 2002,
        "at least the 1001 pairs before 'ready': {}",
        evs.len()
    );
    assert!(evs.iter().all(|e| e.result == 0));
    for pair in evs.chunks_exact(2) {
        // A release's device is left to the reader (the allocation it pairs with).
        assert_eq!((pair[0].device, pair[1].device), (0, -1));
        assert_eq!((pair[0].kind, pair[0].size), (EventKind::Alloc, 1 << 20));
        assert_eq!((pair[1].kind, pair[1].ptr), (EventKind::Free, pair[0].ptr));
    }
}

#[test]
fn cudarc_loader() {
    let s = Scratch::new("cudarc");
    let exe = example("cudarc_client");
    let out = run_ok(traced(&exe, &s.trace_dir()));
    let t = only_trace(&s.trace_dir());
    let evs = events(&t);
    let a = &lines(&out, "cuMemAlloc_v2")[0];
    let e = find(&evs, EventKind::Alloc, "cuMemAlloc_v2", num(a[0]));
    assert_eq!((e.size, e.mem, e.device), (num(a[1]), MemKind::Device, 0));
    let b = &lines(&out, "cuMemAllocAsync")[0];
    let e = find(&evs, EventKind::Alloc, "cuMemAllocAsync", num(b[0]));
    assert_eq!((e.size, e.stream), (12345, num(b[2])));
    let h = &lines(&out, "cuMemHostAlloc")[0];
    let e = find(&evs, EventKind::Alloc, "cuMemHostAlloc", num(h[0]));
    assert_eq!((e.size, e.mem, e.device), (4096, MemKind::Host, -1));
    assert_eq!(evs.len(), 6);
    assert_paired(&evs);
}

#[test]
fn pointers_the_exports_do_not_show_are_routed_by_name() {
    let s = Scratch::new("odd-driver");
    // The odd driver replaces the stand-in for this program only.
    let lib_dir = s.path.join("lib");
    std::fs::create_dir_all(&lib_dir).unwrap();
    let lib = compile_shared(&s, "odd_driver");
    std::fs::rename(&lib, lib_dir.join("libcuda.so.1")).unwrap();
    let exe = compile(&s, "odd_client", false);
    let mut cmd = traced(&exe, &s.trace_dir());
    cmd.env("LD_LIBRARY_PATH", &lib_dir);
    let out = run_ok(cmd);
    let owner = |name: &str| resolved(&out, name);
    assert_eq!(owner("self"), ("preload", "cuGetProcAddress_v2"));
    assert_eq!(
        lines(&out, "dlerror")[0],
        vec!["clean"],
        "a successful dlsym leaves no error"
    );
    assert_eq!(owner("cuMemAlloc"), ("preload", "cuMemAlloc_v2"));
    assert_eq!(
        owner("cuMemAllocAsync/ptsz"),
        ("preload", "cuMemAllocAsync_ptsz")
    );
    assert_eq!(
        owner("cuMemFreeAsync/ptsz"),
        ("preload", "cuMemFreeAsync_ptsz")
    );
    // cuMemAlloc_v2 is exported, so the wrapper calls the export; the _ptsz pair is not, so
    // the wrappers call the addresses cuGetProcAddress handed out.
    assert_eq!(
        lines(&out, "ran")[0],
        vec![
            "exported_alloc=1",
            "internal_alloc=0",
            "internal_async=1",
            "internal_free_async=1"
        ]
    );
    let t = only_trace(&s.trace_dir());
    let evs = events(&t);
    for name in ["cuMemAlloc_v2", "cuMemAllocAsync_ptsz"] {
        let l = &lines(&out, name)[0];
        let e = find(&evs, EventKind::Alloc, name, num(l[0]));
        assert_eq!(e.size, num(l[1]));
    }
    let b = num(lines(&out, "cuMemAllocAsync_ptsz")[0][0]);
    find(&evs, EventKind::Free, "cuMemFreeAsync_ptsz", b);
    assert_eq!(t.devices[0].name, "odd driver");
    assert_eq!(
        t.driver_version, None,
        "this driver has no cuDriverGetVersion"
    );
}

#[test]
fn an_unwritable_trace_directory_costs_one_warning_and_nothing_else() {
    let s = Scratch::new("unwritable");
    let exe = compile(&s, "threads", true);
    let mut cmd = traced(&exe, Path::new("/proc/vramtrace-cannot-create-this"));
    let o = cmd.output().unwrap();
    assert!(o.status.success(), "{o:?}");
    assert_eq!(String::from_utf8_lossy(&o.stdout), "done\n");
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(stderr.lines().count(), 1, "one line, once: {stderr}");
    assert!(
        stderr.starts_with("vramtrace: recording stopped: cannot create a trace file in /proc/"),
        "{stderr}"
    );
}

#[test]
fn a_relative_trace_directory_is_taken_from_the_working_directory() {
    let s = Scratch::new("relative");
    let exe = compile(&s, "dlopen_dlsym", false);
    let mut cmd = traced(&exe, Path::new("rel/trace"));
    cmd.current_dir(&s.path);
    run_ok(cmd);
    assert_eq!(events(&only_trace(&s.path.join("rel/trace"))).len(), 6);
}

/// Eight threads writing as fast as they can (blocks taken concurrently, the file reserved and
/// mapped further while they write): every event is in the trace, each thread's in its order.
#[test]
fn eight_threads_at_full_speed_lose_no_event() {
    let s = Scratch::new("throughput");
    let exe = compile(&s, "throughput", true);
    let mut cmd = traced(&exe, &s.trace_dir());
    cmd.args(["8", "40000"]).env("VRAMTRACE_STACKS", "0");
    run_ok(cmd);
    let t = only_trace(&s.trace_dir());
    assert!(t.problems.is_empty(), "{:?}", t.problems);
    let evs = events(&t);
    assert_eq!(evs.len(), 8 * 40_000 * 2);
    let mut tids: Vec<u32> = evs.iter().map(|e| e.tid).collect();
    tids.sort();
    tids.dedup();
    assert_eq!(tids.len(), 8);
    for tid in tids {
        let mine: Vec<&Event> = evs.iter().filter(|e| e.tid == tid).collect();
        assert_eq!(mine.len(), 80_000);
        for (i, pair) in mine.chunks_exact(2).enumerate() {
            assert_eq!(
                (pair[0].kind, pair[0].size),
                (EventKind::Alloc, 4096 * (1 + i as u64 % 64)),
                "thread {tid}, pair {i}"
            );
            assert_eq!((pair[1].kind, pair[1].ptr), (EventKind::Free, pair[0].ptr));
            assert!(pair[0].t_ns <= pair[1].t_ns);
        }
    }
    // The timed records stream back in time order too.
    let path = std::fs::read_dir(s.trace_dir())
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    let f = vramtrace_format::FileReader::open(&path).unwrap();
    let mut timed = f.timed().unwrap();
    let mut last = 0;
    let mut n = 0;
    for r in timed.by_ref() {
        let t = vramtrace_format::time_of(&r).unwrap();
        assert!(t >= last);
        last = t;
        n += 1;
    }
    assert_eq!(n, 8 * 40_000 * 2);
    assert!(timed.problems().is_empty());
}
