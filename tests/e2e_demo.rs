//! `vramtrace demo` on a machine without a GPU: the README's main job.

mod common;

use common::*;

#[test]
fn demo_attributes_the_failed_allocation_to_a_named_tensor() {
    target_dir(); // the workload, the preload and the stand-in driver, built next to vramtrace
    let out = scratch("demo").join("trace");
    let o = std::process::Command::new(vramtrace())
        .args(["demo", "--simulate", "--out"])
        .arg(&out)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", describe(&o));
    let stdout = String::from_utf8_lossy(&o.stdout);
    // Qwen3.6-27B in 4 bits on a 24 GiB card runs out in chunk 27, in layer 0's GDN call,
    // allocating h; the trace names it and the fla 0.6.0 model agrees on its size.
    assert!(stdout.contains("1 failed allocation(s)"), "{stdout}");
    assert!(
        stdout.contains(
            "in prefill/chunk.27/layer.0/gdn/chunk_gated_delta_rule/chunk_gated_delta_rule_fwd_h"
        ),
        "{stdout}"
    );
    assert!(
        stdout.contains(
            "the failed request is h bfloat16 [1, 65, 48, 128, 128] (97.50 MiB predicted)"
        ),
        "{stdout}"
    );
    assert!(stdout.contains("unexplained 0 B (0.00%)"), "{stdout}");
    assert!(stdout.contains("Next:"), "{stdout}");
    // The trace is left for the user.
    assert!(
        std::fs::read_dir(&out).unwrap().any(|e| e
            .unwrap()
            .path()
            .extension()
            .is_some_and(|x| x == "vtr"))
    );
    // With the native frames named while the workload's binary was here: the workload's own
    // functions, by build id and offset.
    let symbols = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.to_string_lossy().ends_with(".symbols.json"))
        .expect("a symbols file beside the trace");
    let stored: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&symbols).unwrap()).unwrap();
    let frames = stored["frames"].as_array().unwrap();
    assert!(
        frames.iter().any(|f| f["function"]
            .as_str()
            .is_some_and(|n| n.contains("prefill::run::allocate_persistent"))),
        "{frames:?}"
    );
    assert!(
        frames
            .iter()
            .all(|f| f["module"].as_str().is_some_and(|m| !m.is_empty())
                && !f["file"].as_str().unwrap_or("").contains("/registry/src/")),
        "{frames:?}"
    );
}

/// A fractional capacity is one byte count for the CLI, the workload and the stand-in alike: a
/// 23.5 GiB card runs out two chunks before a 24 GiB one, and every "Next:" line runs as printed.
#[test]
fn demo_on_a_fractional_capacity_fails_earlier_and_its_next_lines_run() {
    target_dir();
    let out = scratch("demo-23.5").join("trace");
    let o = std::process::Command::new(vramtrace())
        .args(["demo", "--simulate", "--capacity", "23.5GiB", "--out"])
        .arg(&out)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", describe(&o));
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(
        stdout.contains(
            "in prefill/chunk.25/layer.0/gdn/chunk_gated_delta_rule/chunk_gated_delta_rule_fwd_h; driver said 16.81 MiB free of 23.50 GiB"
        ),
        "{stdout}"
    );
    let next: Vec<&str> = stdout
        .lines()
        .skip_while(|l| *l != "Next:")
        .skip(1)
        .filter(|l| !l.contains("| jq"))
        .collect();
    assert_eq!(next.len(), 4, "{stdout}");
    assert!(next[0].contains(" report "), "{stdout}");
    for line in next {
        let cmd = line.split("   #").next().unwrap().trim();
        let words: Vec<&str> = cmd.split_whitespace().collect();
        let r = std::process::Command::new(words[0])
            .args(&words[1..])
            .output()
            .unwrap_or_else(|e| panic!("{cmd}: {e}"));
        assert!(r.status.success(), "{cmd}: {}", describe(&r));
    }
}
