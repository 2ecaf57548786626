//! Byte and time quantities as users read and type them.

/// Formats bytes the way PyTorch's OOM message does: `50.00 MiB`, `23.69 GiB`, `512 B`.
pub fn fmt_bytes(b: u64) -> String {
    const KIB: f64 = 1024.0;
    let f = b as f64;
    if b < 1024 {
        format!("{b} B")
    } else if f < KIB * KIB {
        format!("{:.2} KiB", f / KIB)
    } else if f < KIB * KIB * KIB {
        format!("{:.2} MiB", f / (KIB * KIB))
    } else {
        format!("{:.2} GiB", f / (KIB * KIB * KIB))
    }
}

/// Formats seconds with a unit suited to their size.
pub fn fmt_secs(s: f64) -> String {
    if s < 1e-3 {
        format!("{:.0} µs", s * 1e6)
    } else if s < 1.0 {
        format!("{:.1} ms", s * 1e3)
    } else {
        format!("{s:.3} s")
    }
}

/// Parses a byte count: a plain integer or a number with a unit (`24GiB`, `512 MiB`, `80GB`,
/// `1.5G`; binary for `KiB/MiB/GiB/TiB` and bare `K/M/G/T`, decimal for `KB/MB/GB/TB`).
pub fn parse_bytes(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '_'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let num = num.replace('_', "");
    let mult: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "kib" => 1024.0,
        "m" | "mib" => 1024.0 * 1024.0,
        "g" | "gib" => 1024.0 * 1024.0 * 1024.0,
        "t" | "tib" => 1024.0f64.powi(4),
        "kb" => 1e3,
        "mb" => 1e6,
        "gb" => 1e9,
        "tb" => 1e12,
        other => {
            return Err(format!(
                "unknown unit {other:?} in {s:?} (use B, KiB, MiB, GiB, TiB, KB, MB, GB or TB)"
            ));
        }
    };
    if num.is_empty() {
        return Err(format!(
            "{s:?} is not a byte count (expected e.g. 24GiB or 1048576)"
        ));
    }
    if unit.trim().is_empty() || unit.trim().eq_ignore_ascii_case("b") {
        return num
            .parse::<u64>()
            .map_err(|_| format!("{s:?} is not a whole number of bytes"));
    }
    let v: f64 = num.parse().map_err(|_| format!("{s:?} is not a number"))?;
    let bytes = v * mult;
    if !bytes.is_finite() || bytes < 0.0 || bytes > u64::MAX as f64 {
        return Err(format!("{s:?} is out of range"));
    }
    Ok(bytes.round() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_like_pytorch() {
        assert_eq!(fmt_bytes(50 << 20), "50.00 MiB");
        assert_eq!(fmt_bytes(512), "512 B");
        assert_eq!(fmt_bytes(24 << 30), "24.00 GiB");
        assert_eq!(fmt_bytes(50_724_864), "48.38 MiB");
    }

    #[test]
    fn parses_units() {
        assert_eq!(parse_bytes("24GiB"), Ok(24 << 30));
        assert_eq!(parse_bytes("512 MiB"), Ok(512 << 20));
        assert_eq!(parse_bytes("80GB"), Ok(80_000_000_000));
        assert_eq!(parse_bytes("1048576"), Ok(1 << 20));
        assert_eq!(parse_bytes("1.5G"), Ok(3 << 29));
        assert!(parse_bytes("lots").is_err());
        assert!(parse_bytes("12 parsecs").is_err());
    }
}
