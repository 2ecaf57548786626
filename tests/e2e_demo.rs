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
}
