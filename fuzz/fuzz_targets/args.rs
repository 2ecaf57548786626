//! Bytes as the command line's numbers: byte sizes (`--capacity`, `--resident`), `--at`
//! moments and windows, and `--sweep` ranges. Each parses or gives an error; an accepted value
//! obeys its documented bounds.
#![no_main]

use libfuzzer_sys::fuzz_target;
use vramtrace::observe::At;
use vramtrace::parse::{parse_at, parse_range};
use vramtrace_models::units::parse_bytes;

fuzz_target!(|data: &[u8]| {
    let Ok(s) = std::str::from_utf8(data) else {
        return;
    };
    let _ = parse_bytes(s);
    if let Ok(At::Window(a, b)) = parse_at(s) {
        assert!(a.is_finite() && b.is_finite() && 0.0 <= a && a <= b);
    }
    if let Ok((a, b)) = parse_range(s) {
        assert!(1 <= a && a <= b && b <= vramtrace_models::MAX_TOKENS);
    }
});
