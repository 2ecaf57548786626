//! End-to-end: programs reach the stand-in driver in each way real programs do, under the real
//! preload and the real `vramtrace run` / `vramtrace events`.

mod common;

use common::*;
use std::ffi::OsStr;
use std::process::Command;

#[test]
fn linked_with_lcuda_every_event_exact() {
    let prog = c_program("linked", true);
    let out = scratch("linked").join("trace");
    let o = run_traced(&out, "24GiB", &[prog.as_os_str()]);
    assert_eq!(o.status.code(), Some(0), "{}", describe(&o));
    assert_eq!(
        String::from_utf8_lossy(&o.stdout),
        "done\n",
        "the preload must print nothing on stdout"
    );
    let ev = events(&out);
    let main_tid = ev[0]["tid"].as_u64().unwrap();
    let main: Vec<_> = ev
        .iter()
        .filter(|e| e["tid"].as_u64() == Some(main_tid))
        .cloned()
        .collect();
    assert_eq!(
        kinds_apis_sizes(&main),
        vec![
            e("alloc", "cuMemAlloc_v2", 10 * MIB),
            e("alloc", "cuMemAlloc_v2", 20 * MIB),
            e("free", "cuMemFree_v2", 10 * MIB),
            e("alloc", "cuMemHostAlloc", MIB),
            e("free", "cuMemFreeHost", MIB),
            e("alloc_failed", "cuMemAlloc_v2", 1 << 40),
            e("free", "cuMemFree_v2", 20 * MIB),
        ]
    );
    // Host memory is kept apart from device memory.
    assert_eq!(main[3]["mem"], "host");
    assert_eq!(main[0]["mem"], "device");
    // The failure carries the driver's view of free memory at that moment: 24 GiB minus the
    // 20 MiB still held.
    let failed = &main[5];
    assert_eq!(failed["result"], 2);
    assert_eq!(failed["total_bytes"], 24u64 << 30);
    assert_eq!(failed["free_bytes"], (24u64 << 30) - 20 * MIB);
    // Three worker threads, each 4 alloc/free pairs of (i+1) MiB, paired by size.
    let workers: Vec<_> = ev
        .iter()
        .filter(|e| e["tid"].as_u64() != Some(main_tid))
        .collect();
    let mut tids: Vec<u64> = workers.iter().map(|e| e["tid"].as_u64().unwrap()).collect();
    tids.sort();
    tids.dedup();
    assert_eq!(tids.len(), 3, "events of three worker threads");
    for t in tids {
        let mine: Vec<_> = workers
            .iter()
            .filter(|e| e["tid"].as_u64() == Some(t))
            .cloned()
            .cloned()
            .collect();
        let size = mine[0]["size"].as_u64().unwrap();
        assert!([MIB, 2 * MIB, 3 * MIB].contains(&size));
        let expect: Vec<_> = (0..4)
            .flat_map(|_| {
                [
                    e("alloc", "cuMemAlloc_v2", size),
                    e("free", "cuMemFree_v2", size),
                ]
            })
            .collect();
        assert_eq!(kinds_apis_sizes(&mine), expect);
    }
    // Time order across threads.
    let ts: Vec<u64> = ev.iter().map(|e| e["t_ns"].as_u64().unwrap()).collect();
    assert!(ts.windows(2).all(|w| w[0] <= w[1]));
    // The run's summary names the peak and the failure.
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("failed allocation"), "{err}");
    assert!(err.contains("1024.00 GiB"), "{err}");
}

#[test]
fn dlopen_and_dlsym() {
    let prog = c_program("dlopen_dlsym", false);
    let out = scratch("dlopen").join("trace");
    let o = run_traced(&out, "24GiB", &[prog.as_os_str()]);
    assert_eq!(o.status.code(), Some(0), "{}", describe(&o));
    let ev = events(&out);
    assert_eq!(
        kinds_apis_sizes(&ev),
        vec![
            e("alloc", "cuMemAlloc_v2", 3 * MIB),
            e("alloc", "cuMemAlloc_v2", 4097),
            e("alloc", "cuMemHostAlloc", 8192),
            e("free", "cuMemFree_v2", 3 * MIB),
            e("free", "cuMemFree_v2", 4097),
            e("free", "cuMemFreeHost", 8192),
        ]
    );
    assert_eq!(ev[2]["mem"], "host");
    assert_eq!(ev[2]["device"], -1);
}

#[test]
fn releases_show_the_device_of_what_they_release() {
    // The recorder leaves a successful release's device unknown; `vramtrace events` shows the
    // device of the allocation it releases. every_api.c releases device 1's VMM handle while
    // device 0 is current.
    let prog = c_program("every_api", true);
    let out = scratch("release-device").join("trace");
    let o = Command::new(vramtrace())
        .args(["run", "--quiet", "--out"])
        .arg(&out)
        .arg("--")
        .arg(&prog)
        .env("LD_LIBRARY_PATH", fake_driver_dir())
        .env("VRAMTRACE_FAKE_CAPACITY", "1GiB")
        .env("VRAMTRACE_FAKE_DEVICES", "2")
        .env_remove("LD_PRELOAD")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", describe(&o));
    let ev = events(&out);
    let mut releases = 0;
    for (i, r) in ev.iter().enumerate() {
        if !matches!(r["kind"].as_str(), Some("free" | "unmap")) {
            continue;
        }
        let made = ev[..i]
            .iter()
            .rev()
            .find(|a| {
                matches!(a["kind"].as_str(), Some("alloc" | "map"))
                    && a["ptr"] == r["ptr"]
                    && a["mem"] == r["mem"]
            })
            .unwrap_or_else(|| panic!("no allocation for {r}"));
        assert_eq!(r["device"], made["device"], "{r} releases {made}");
        assert_eq!(r["size"], made["size"], "{r} releases {made}");
        releases += 1;
    }
    assert_eq!(releases, 12);
    let release = ev.iter().find(|e| e["api"] == "cuMemRelease").unwrap();
    assert_eq!(release["device"], 1, "device 1's handle, device 0 current");
    let host = ev.iter().find(|e| e["api"] == "cuMemFreeHost").unwrap();
    assert_eq!(host["device"], -1);
    let free = ev.iter().find(|e| e["api"] == "cuMemFree_v2").unwrap();
    assert_eq!(free["device"], 0);
}

#[test]
fn get_proc_address_like_cudart_13() {
    let prog = c_program("procaddr", false);
    let out = scratch("procaddr").join("trace");
    let o = run_traced(&out, "1GiB", &[prog.as_os_str()]);
    assert_eq!(o.status.code(), Some(0), "{}", describe(&o));
    // Every allocation entry point the program resolved through cuGetProcAddress is ours.
    let stdout = String::from_utf8_lossy(&o.stdout);
    for l in stdout
        .lines()
        .filter(|l| l.starts_with("resolved cuMem") && !l.contains("GetInfo"))
    {
        assert!(l.contains(" preload "), "{l}");
    }
    let ev = events(&out);
    let free_then = (1u64 << 30) - 17 * MIB;
    assert_eq!(
        kinds_apis_sizes(&ev),
        vec![
            e("alloc", "cuMemAlloc_v2", 7 * MIB),
            e("alloc", "cuMemAllocAsync", MIB),
            e("alloc", "cuMemAllocAsync_ptsz", 9 * MIB),
            e("alloc_failed", "cuMemAlloc_v2", free_then + 1),
            e("free", "cuMemFreeAsync_ptsz", 9 * MIB),
            e("free", "cuMemFreeAsync", MIB),
            e("free", "cuMemFree_v2", 7 * MIB),
        ]
    );
    assert_eq!(ev[3]["free_bytes"], free_then);
    assert_eq!(ev[3]["total_bytes"], 1u64 << 30);
}

#[test]
fn exit_code_passes_through_and_output_dir_is_never_reused() {
    let dir = scratch("exit");
    let out = dir.join("trace");
    let o = run_traced(
        &out,
        "1GiB",
        &[OsStr::new("sh"), OsStr::new("-c"), OsStr::new("exit 7")],
    );
    assert_eq!(o.status.code(), Some(7), "{}", describe(&o));
    std::fs::write(out.join("keep.vtr"), b"x").unwrap();
    let o = run_traced(&out, "1GiB", &[OsStr::new("true")]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("never overwrites"),
        "{}",
        describe(&o)
    );
}

#[test]
fn sigkill_while_allocating_leaves_a_readable_trace() {
    use std::io::BufRead;
    let prog = c_program("alloc_forever", true);
    let out = scratch("sigkill").join("trace");
    let mut child = std::process::Command::new(vramtrace())
        .args(["run", "--quiet", "--out"])
        .arg(&out)
        .arg("--")
        .arg(&prog)
        .env("LD_LIBRARY_PATH", fake_driver_dir())
        .env("VRAMTRACE_FAKE_CAPACITY", "4TiB")
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line, "ready\n");
    // Kill the traced program itself (vramtrace run's child), mid-allocation.
    let pid = std::fs::read_dir(&out)
        .unwrap()
        .filter_map(|e| e.ok())
        .find_map(|e| {
            e.path()
                .file_stem()?
                .to_str()?
                .split('-')
                .next()?
                .parse::<i32>()
                .ok()
        })
        .expect("a trace file named after the traced pid");
    // Safety: kill(2) on a pid we started; SIGKILL cannot be caught.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGKILL) }, 0);
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(128 + 9));
    let ev = events(&out);
    assert!(
        ev.len() > 2000,
        "every event before the kill is read back ({} events)",
        ev.len()
    );
    // 1 MiB alloc/free pairs in order up to the kill (the last may be an unpaired alloc).
    for (i, e) in ev.iter().enumerate() {
        let want = if i % 2 == 0 { "alloc" } else { "free" };
        assert_eq!(
            (e["kind"].as_str(), e["size"].as_u64()),
            (Some(want), Some(MIB)),
            "event {i}"
        );
    }
}

#[test]
fn stacks_are_symbolised_offline_with_the_programs_own_functions() {
    let prog = c_program("stacks", true);
    let out = scratch("stacks").join("trace");
    let o = run_traced(&out, "1GiB", &[prog.as_os_str()]);
    assert_eq!(o.status.code(), Some(0), "{}", describe(&o));
    let o = std::process::Command::new(vramtrace())
        .args(["events", "--stacks"])
        .arg(&out)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", describe(&o));
    let ev: Vec<serde_json::Value> = String::from_utf8(o.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let funcs = |e: &serde_json::Value| -> Vec<String> {
        e["frames"]
            .as_array()
            .unwrap()
            .iter()
            .take(3)
            .map(|f| f["function"].as_str().unwrap_or("?").to_string())
            .collect()
    };
    let deep: Vec<_> = ev
        .iter()
        .filter(|e| e["kind"] == "alloc" && e["size"] == 1001)
        .collect();
    assert_eq!(deep.len(), 3);
    for e in &deep {
        assert_eq!(
            funcs(e),
            ["vramtrace_test_inner", "vramtrace_test_outer", "main"],
            "{e}"
        );
        let f0 = &e["frames"][0];
        assert!(f0["file"].as_str().unwrap().ends_with("stacks.c"), "{f0}");
        assert!(f0["line"].as_u64().is_some(), "{f0}");
    }
    // One call site, one stack: the three allocations share a stack id.
    assert!(deep.iter().all(|e| e["stack"] == deep[0]["stack"]));
    let direct = ev
        .iter()
        .find(|e| e["kind"] == "alloc" && e["size"] == 5000)
        .unwrap();
    assert_eq!(funcs(direct)[..2], ["vramtrace_test_inner", "main"]);
    assert_ne!(direct["stack"], deep[0]["stack"]);
}

#[test]
fn summary_gives_the_exact_peak_and_the_live_set_at_the_failure() {
    let prog = c_program("linked", true);
    let out = scratch("linked-summary").join("trace");
    let o = run_traced(&out, "24GiB", &[prog.as_os_str()]);
    assert_eq!(o.status.code(), Some(0), "{}", describe(&o));
    let o = std::process::Command::new(vramtrace())
        .args(["summary", "--json"])
        .arg(&out)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", describe(&o));
    let s: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let d = s["processes"][0]["devices"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["device"] == 0)
        .unwrap()
        .clone();
    // 10 MiB and 20 MiB are live together before the 10 MiB is freed; the workers' 1-3 MiB
    // pairs come later, next to the 20 MiB alone (at most 26 MiB).
    assert_eq!(d["peak_bytes"], 30 * MIB);
    let sizes: Vec<u64> = d["peak_live"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["size"].as_u64().unwrap())
        .collect();
    assert_eq!(sizes, [20 * MIB, 10 * MIB]);
    let f = &d["failures"][0];
    assert_eq!(f["size"], 1u64 << 40);
    assert_eq!(f["live_bytes"], 20 * MIB);
    assert_eq!(f["live"][0]["size"], 20 * MIB);
    assert_eq!(f["free_bytes"], (24u64 << 30) - 20 * MIB);
    assert_eq!(d["name"], "vramtrace stand-in GPU");
}

/// `vramtrace run --simulate` needs no GPU and no environment: it points the program at the
/// stand-in driver itself, sized by `--capacity` (fractional units included).
#[test]
fn run_simulate_records_without_a_gpu() {
    let prog = c_program("linked", true);
    let out = scratch("simulate").join("trace");
    let o = Command::new(vramtrace())
        .args(["run", "--simulate", "--capacity", "23.5GiB", "--out"])
        .arg(&out)
        .arg("--")
        .arg(&prog)
        .env_remove("LD_LIBRARY_PATH")
        .env_remove("VRAMTRACE_FAKE_CAPACITY")
        .env_remove("LD_PRELOAD")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", describe(&o));
    let ev = events(&out);
    let failed: Vec<_> = ev.iter().filter(|e| e["kind"] == "alloc_failed").collect();
    assert_eq!(failed.len(), 1, "{}", describe(&o));
    let total = 23 * (1u64 << 30) + (1 << 29);
    assert_eq!(failed[0]["total_bytes"], total);
    assert_eq!(failed[0]["size"], 1u64 << 40);
    assert!(
        ev.iter()
            .any(|e| e["kind"] == "alloc" && e["size"] == 20 * MIB)
    );
}

/// `--capacity` means nothing without the stand-in and is refused rather than ignored.
#[test]
fn run_capacity_needs_simulate() {
    let o = Command::new(vramtrace())
        .args(["run", "--capacity", "24GiB", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("--simulate"),
        "{}",
        describe(&o)
    );
}

/// Handles obtained elsewhere (issue 13, NCCL): a `cuMemCreate` exported as a file descriptor,
/// imported in a forked child and in the same process, retained from mapped addresses, every
/// reference released. Every `cuMemRelease` pairs; imported memory is its own pool, never this
/// process's device bytes; everything ends at 0.
#[test]
fn handles_obtained_elsewhere_pair_and_are_not_device_bytes() {
    let prog = c_program("handles", true);
    let out = scratch("handles").join("trace");
    let o = run_traced(&out, "24GiB", &[prog.as_os_str()]);
    assert_eq!(o.status.code(), Some(0), "{}", describe(&o));
    let ev = events(&out);
    let count = |api: &str, kind: &str| {
        ev.iter()
            .filter(|e| e["api"] == api && e["kind"] == kind)
            .count()
    };
    // Parent: 1 create, 1 import, 2 retains (+ a failed import and a failed retain);
    // child: 1 import, 1 retain. Each success is released once.
    assert_eq!(count("cuMemCreate", "alloc"), 1);
    assert_eq!(count("cuMemImportFromShareableHandle", "alloc"), 2);
    assert_eq!(count("cuMemRetainAllocationHandle", "alloc"), 3);
    assert_eq!(count("cuMemImportFromShareableHandle", "alloc_failed"), 1);
    assert_eq!(count("cuMemRetainAllocationHandle", "alloc_failed"), 1);
    assert_eq!(count("cuMemRelease", "free"), 6);
    for e in &ev {
        assert_ne!(e["unmatched"], true, "an unpaired release: {e}");
    }
    // The imported handles' releases carry the size they were mapped as, in their own pool.
    let imported_frees: Vec<_> = ev
        .iter()
        .filter(|e| e["api"] == "cuMemRelease" && e["mem"] == "imported")
        .collect();
    assert_eq!(imported_frees.len(), 2);
    assert!(imported_frees.iter().all(|e| e["size"] == 4 * MIB));

    let s = Command::new(vramtrace())
        .args(["summary", "--json"])
        .arg(&out)
        .output()
        .unwrap();
    assert!(s.status.success(), "{}", describe(&s));
    let s: serde_json::Value = serde_json::from_slice(&s.stdout).unwrap();
    let procs = s["processes"].as_array().unwrap();
    assert_eq!(procs.len(), 2);
    for p in procs {
        let d = &p["devices"][0];
        assert_eq!(d["live_at_end"], 0, "{p}");
        let imported = d["other_pools"]
            .as_array()
            .unwrap()
            .iter()
            .find(|x| x["pool"] == "imported")
            .unwrap_or_else(|| panic!("no imported pool: {p}"));
        assert_eq!(imported["allocations"], 1);
        assert_eq!(imported["frees"], 1);
        assert_eq!(imported["peak_bytes"], 4 * MIB);
        assert_eq!(imported["live_at_end"], 0);
    }
    // Device bytes: only the creating process's 4 MiB, never the imports.
    let mut device_peaks: Vec<u64> = procs
        .iter()
        .map(|p| p["devices"][0]["peak_bytes"].as_u64().unwrap())
        .collect();
    device_peaks.sort();
    assert_eq!(device_peaks, vec![0, 4 * MIB]);
}
