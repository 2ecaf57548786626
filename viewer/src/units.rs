//! Byte sizes, times and counts as the live view and the plots write them: bytes through the
//! one formatter (`vramtrace_models::units`, models/src/units.rs) in its short style, counts
//! from `vramtrace-view-model`.

pub use vramtrace_models::units::ByteUnit;
use vramtrace_models::units::{ByteStyle, format_bytes as format_in};
pub use vramtrace_view_model::format_count;

/// `bytes` in the largest fitting binary unit, in the short style of the live view and the plots
/// (`vramtrace_models::units::ByteStyle::Short`): `512 B`, `318.9 MiB`, `23.50 GiB`.
pub fn format_bytes(bytes: u64) -> String {
    format_in(i128::from(bytes), ByteStyle::Short)
}

/// Like [`format_bytes`], for a difference that may be negative: `-1.50 GiB`.
pub fn format_signed_bytes(bytes: i128) -> String {
    format_in(bytes, ByteStyle::Short)
}

/// Seconds as `12.345 s`, `1.5 ms`: times near zero keep their precision.
pub fn format_seconds(s: f64) -> String {
    if s != 0.0 && s.abs() < 1.0 {
        format!("{:.1} ms", s * 1000.0)
    } else if s.abs() < 100.0 {
        format!("{s:.2} s")
    } else {
        format!("{s:.0} s")
    }
}

/// The smallest of 1, 1.5, 2, 2.5, 3, 4, 5, 6 and 8 times a power of ten that is at least `x`
/// (for axis steps people can read); 1 for `x <= 0`.
pub fn nice_ceil(x: f64) -> f64 {
    if x <= 0.0 || !x.is_finite() {
        return 1.0;
    }
    let power = 10f64.powf(x.log10().floor());
    [1.0, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0]
        .into_iter()
        .map(|m| m * power)
        .find(|&v| v >= x * (1.0 - 1e-12))
        .unwrap_or(10.0 * power)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_read_as_people_write_them() {
        assert_eq!(format_bytes(0), "0 B");
        assert_eq!(format_bytes(512), "512 B");
        assert_eq!(format_bytes(1536), "1.5 KiB");
        assert_eq!(format_bytes(334_399_488), "318.9 MiB");
        assert_eq!(format_bytes(24 << 30), "24.00 GiB");
        assert_eq!(format_bytes(23 * (1 << 30) + (1 << 29)), "23.50 GiB");
        assert_eq!(format_signed_bytes(-(3 << 29)), "-1.50 GiB");
        assert_eq!(ByteUnit::GiB.format(3.0 * (1u64 << 30) as f64, 0), "3 GiB");
    }

    #[test]
    fn nice_steps() {
        assert_eq!(nice_ceil(13.2), 15.0);
        assert_eq!(nice_ceil(2.1), 2.5);
        assert_eq!(nice_ceil(0.35), 0.4);
        assert_eq!(nice_ceil(7.0), 8.0);
        assert_eq!(nice_ceil(5.0), 5.0);
        assert_eq!(nice_ceil(0.0), 1.0);
    }

    #[test]
    fn seconds() {
        assert_eq!(format_seconds(0.0), "0.00 s");
        assert_eq!(format_seconds(0.0015), "1.5 ms");
        assert_eq!(format_seconds(12.345), "12.35 s");
        assert_eq!(format_seconds(1234.0), "1234 s");
    }
}
