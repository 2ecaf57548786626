//! Python frames through the real CLI: a CPython program allocating through the stand-in driver
//! with ctypes (the GIL released, as PyTorch's bindings release it), under `vramtrace run`;
//! `vramtrace events --stacks` and `vramtrace summary` name the Python file, line and function
//! ahead of the native frames.

mod common;

use std::path::Path;
use std::process::Command;

use common::*;

fn script() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("probes/preload/tests/py/py_frames.py")
}

#[test]
fn events_and_summary_show_python_lines_above_native_frames() {
    if !vramtrace_testkit::python3_or_skip() {
        return;
    }
    let out = scratch("py-cli").join("trace");
    let o = run_traced(&out, "24GiB", &["python3".as_ref(), script().as_os_str()]);
    assert_eq!(o.status.code(), Some(0), "{}", describe(&o));
    let stdout = String::from_utf8_lossy(&o.stdout);
    let released = stdout
        .lines()
        .find(|l| l.ends_with("empty_cuda_released chunk_fwd_o forward <module>"))
        .expect("the program's line for the GIL-released allocation");
    let fields: Vec<&str> = released.split(' ').collect();
    let (ptr, line) = (fields[1].parse::<u64>().unwrap(), fields[2]);

    let o = Command::new(vramtrace())
        .args(["events", "--stacks"])
        .arg(&out)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", describe(&o));
    let text = String::from_utf8(o.stdout).unwrap();
    let ev: serde_json::Value = text
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .find(|e| e["kind"] == "alloc" && e["ptr"].as_str() == Some(&format!("{ptr:#x}")))
        .unwrap_or_else(|| panic!("no alloc event at {ptr:#x} in:\n{text}"));
    let frames = ev["frames"].as_array().expect("frames with --stacks");
    let first = &frames[0];
    assert_eq!(first["module"], "python");
    assert_eq!(first["function"], "empty_cuda_released");
    assert_eq!(first["line"].as_u64(), Some(line.parse().unwrap()));
    assert_eq!(first["file"].as_str(), script().to_str());
    let names: Vec<&str> = frames
        .iter()
        .take_while(|f| f["module"] == "python")
        .map(|f| f["function"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        ["empty_cuda_released", "chunk_fwd_o", "forward", "<module>"]
    );
    assert!(
        frames.len() > names.len(),
        "the native frames follow the Python frames"
    );

    let o = Command::new(vramtrace())
        .arg("summary")
        .arg(&out)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", describe(&o));
    let text = String::from_utf8(o.stdout).unwrap();
    assert!(
        text.contains(&format!("py_frames.py:{line} empty_cuda_released")),
        "summary names the Python line:\n{text}"
    );
}
