//! Byte sizes and times as people read them.

const KIB: f64 = 1024.0;
const MIB: f64 = KIB * 1024.0;
const GIB: f64 = MIB * 1024.0;
const TIB: f64 = GIB * 1024.0;

/// A binary byte unit, chosen once per axis so every label on it agrees.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ByteUnit {
    /// Bytes.
    B,
    /// 2¹⁰ bytes.
    KiB,
    /// 2²⁰ bytes.
    MiB,
    /// 2³⁰ bytes.
    GiB,
    /// 2⁴⁰ bytes.
    TiB,
}

impl ByteUnit {
    /// The largest unit in which `bytes` is at least one.
    pub fn for_bytes(bytes: f64) -> Self {
        let b = bytes.abs();
        if b >= TIB {
            Self::TiB
        } else if b >= GIB {
            Self::GiB
        } else if b >= MIB {
            Self::MiB
        } else if b >= KIB {
            Self::KiB
        } else {
            Self::B
        }
    }

    /// Bytes in one of this unit.
    pub fn bytes(self) -> f64 {
        match self {
            Self::B => 1.0,
            Self::KiB => KIB,
            Self::MiB => MIB,
            Self::GiB => GIB,
            Self::TiB => TIB,
        }
    }

    /// The unit's symbol.
    pub fn symbol(self) -> &'static str {
        match self {
            Self::B => "B",
            Self::KiB => "KiB",
            Self::MiB => "MiB",
            Self::GiB => "GiB",
            Self::TiB => "TiB",
        }
    }

    /// `bytes` in this unit with `decimals` digits after the point and the symbol.
    pub fn format(self, bytes: f64, decimals: usize) -> String {
        if self == Self::B {
            return format!("{bytes:.0} B");
        }
        format!("{:.*} {}", decimals, bytes / self.bytes(), self.symbol())
    }
}

/// `bytes` in the largest fitting binary unit: `512 B`, `318.9 MiB`, `23.50 GiB`.
pub fn format_bytes(bytes: u64) -> String {
    format_signed_bytes(bytes as i128)
}

/// Like [`format_bytes`], for a difference that may be negative.
pub fn format_signed_bytes(bytes: i128) -> String {
    let b = bytes as f64;
    let unit = ByteUnit::for_bytes(b);
    let decimals = match unit {
        ByteUnit::B => 0,
        ByteUnit::KiB | ByteUnit::MiB => 1,
        ByteUnit::GiB | ByteUnit::TiB => 2,
    };
    unit.format(b, decimals)
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

/// A token count with thousands separators: `12,345`.
pub fn format_count(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
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
        assert_eq!(ByteUnit::GiB.format(3.0 * GIB, 0), "3 GiB");
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
    fn seconds_and_counts() {
        assert_eq!(format_seconds(0.0), "0.00 s");
        assert_eq!(format_seconds(0.0015), "1.5 ms");
        assert_eq!(format_seconds(12.345), "12.35 s");
        assert_eq!(format_seconds(1234.0), "1234 s");
        assert_eq!(format_count(0), "0");
        assert_eq!(format_count(999), "999");
        assert_eq!(format_count(12_345), "12,345");
        assert_eq!(format_count(1_234_567), "1,234,567");
    }
}
