//! Byte and time quantities as users read and type them.
//!
//! This module holds vramtrace's one byte formatter ([`format_bytes`]) and its one byte parser
//! ([`parse_bytes`]). Every crate that writes a byte count for people goes through
//! [`format_bytes`]: the reports and the CLI in PyTorch's style ([`fmt_bytes`], [`ByteStyle::Torch`]),
//! the live view and the plots in their shorter one ([`ByteStyle::Short`]), a column or an axis
//! in one fixed unit ([`ByteUnit::format`], [`ByteUnit::number`]). (`torch_format_size` in
//! `src/report/triage/torch_oom.rs` is not a formatter of its own: it reproduces PyTorch's
//! message, its `bytes` and its `<=` bounds included.)

const KIB: f64 = 1024.0;
const MIB: f64 = KIB * 1024.0;
const GIB: f64 = MIB * 1024.0;
const TIB: f64 = GIB * 1024.0;

/// A binary byte unit: chosen for one count by [`format_bytes`], or once for a whole axis or
/// column so that every label on it agrees.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
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
    /// The largest unit in which `bytes` (or its magnitude) is at least one.
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

    /// `bytes` in this unit as a bare number with `decimals` digits after the point (none in
    /// bytes, which are whole): `318.91` for a column headed `MiB`.
    pub fn number(self, bytes: f64, decimals: usize) -> String {
        if self == Self::B {
            return format!("{bytes:.0}");
        }
        format!("{:.*}", decimals, bytes / self.bytes())
    }

    /// `bytes` in this unit with `decimals` digits after the point and the symbol: `318.91 MiB`,
    /// `3 GiB`, `512 B` (bytes are whole).
    pub fn format(self, bytes: f64, decimals: usize) -> String {
        format!("{} {}", self.number(bytes, decimals), self.symbol())
    }
}

/// How [`format_bytes`] writes a count: the largest unit it uses and the digits after the point
/// in each.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ByteStyle {
    /// PyTorch's OOM message (`50.00 MiB`, `23.69 GiB`, `512 B`): two decimals, and GiB however
    /// large the count, as PyTorch writes it. The reports, the CLI and the models' text.
    Torch,
    /// The live view and the plots, where space is short (`318.9 MiB`, `23.50 GiB`,
    /// `1.25 TiB`): one decimal in KiB and MiB, two in GiB and TiB.
    Short,
}

impl ByteStyle {
    /// The largest unit this style writes.
    pub fn largest_unit(self) -> ByteUnit {
        match self {
            Self::Torch => ByteUnit::GiB,
            Self::Short => ByteUnit::TiB,
        }
    }

    /// The digits after the point in `unit`.
    pub fn decimals(self, unit: ByteUnit) -> usize {
        match (self, unit) {
            (_, ByteUnit::B) => 0,
            (Self::Torch, _) => 2,
            (Self::Short, ByteUnit::KiB | ByteUnit::MiB) => 1,
            (Self::Short, ByteUnit::GiB | ByteUnit::TiB) => 2,
        }
    }
}

/// The one byte formatter: `bytes` in the largest binary unit in which it is at least one (up to
/// the style's largest), with the style's decimals. A negative count keeps its sign (`-1.50 GiB`);
/// callers that write differences their own way (`+`, `−`) format the magnitude.
pub fn format_bytes(bytes: i128, style: ByteStyle) -> String {
    let b = bytes as f64;
    let unit = ByteUnit::for_bytes(b).min(style.largest_unit());
    unit.format(b, style.decimals(unit))
}

/// Formats bytes the way PyTorch's OOM message does: `50.00 MiB`, `23.69 GiB`, `512 B`
/// ([`format_bytes`] in [`ByteStyle::Torch`]).
pub fn fmt_bytes(b: u64) -> String {
    format_bytes(i128::from(b), ByteStyle::Torch)
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

/// Why a byte count did not parse; each message names the input and what to write instead.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseBytesError {
    /// A unit that is none of B, KiB, MiB, GiB, TiB, KB, MB, GB, TB.
    #[error("unknown unit {unit:?} in {input:?} (use B, KiB, MiB, GiB, TiB, KB, MB, GB or TB)")]
    UnknownUnit {
        /// The unit as written.
        unit: String,
        /// The whole input.
        input: String,
    },
    /// No number before the unit.
    #[error("{0:?} is not a byte count (expected e.g. 24GiB or 1048576)")]
    NotACount(String),
    /// More than 2^64 − 1 bytes.
    #[error("{0:?} is out of range: byte counts go up to {max} (16 EiB)", max = u64::MAX)]
    OutOfRange(String),
    /// A fraction of a byte.
    #[error("{0:?} is not a whole number of bytes")]
    NotWhole(String),
    /// Not a decimal number.
    #[error("{0:?} is not a number")]
    NotANumber(String),
    /// Finer than any byte count needs.
    #[error("{0:?} has more than 18 digits after the decimal point")]
    TooPrecise(String),
}

/// Parses a byte count: a plain integer or a number with a unit (`24GiB`, `512 MiB`, `80GB`,
/// `1.5G`, `23.5GiB`; binary for `KiB/MiB/GiB/TiB` and bare `K/M/G/T`, decimal for
/// `KB/MB/GB/TB`). Units are case-insensitive and may follow a space; `_` may group digits.
///
/// The arithmetic is on integers, so the result is exact: `24GiB` is 25769803776 and `1.5GiB`
/// is 1610612736. A fraction that does not come to whole bytes (`0.1KiB`) rounds to the nearest
/// byte, halves up. A bare number or one in `B` must be whole. Counts above `u64::MAX` are refused,
/// never wrapped.
pub fn parse_bytes(s: &str) -> Result<u64, ParseBytesError> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '_'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let num = num.replace('_', "");
    let unit = unit.trim();
    let mult: u64 = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kib" => 1 << 10,
        "m" | "mib" => 1 << 20,
        "g" | "gib" => 1 << 30,
        "t" | "tib" => 1 << 40,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        "tb" => 1_000_000_000_000,
        other => {
            return Err(ParseBytesError::UnknownUnit {
                unit: other.to_string(),
                input: s.to_string(),
            });
        }
    };
    if num.is_empty() {
        return Err(ParseBytesError::NotACount(s.to_string()));
    }
    let out_of_range = || ParseBytesError::OutOfRange(s.to_string());
    let (whole, frac) = num.split_once('.').unwrap_or((&num, ""));
    if mult == 1 {
        if !frac.is_empty() || num.contains('.') {
            return Err(ParseBytesError::NotWhole(s.to_string()));
        }
        return whole.parse::<u64>().map_err(|_| out_of_range());
    }
    if (whole.is_empty() && frac.is_empty()) || frac.contains('.') {
        return Err(ParseBytesError::NotANumber(s.to_string()));
    }
    // 18 digits keep `fraction * unit` within u128 and are far finer than one byte.
    if frac.len() > 18 {
        return Err(ParseBytesError::TooPrecise(s.to_string()));
    }
    let whole: u64 = match whole {
        "" => 0,
        w => w.parse().map_err(|_| out_of_range())?,
    };
    let whole_bytes = whole.checked_mul(mult).ok_or_else(out_of_range)?;
    let frac_bytes = match frac {
        "" => 0,
        f => {
            let digits: u128 = f
                .parse()
                .map_err(|_| ParseBytesError::NotANumber(s.to_string()))?;
            let den = 10u128.pow(f.len() as u32);
            // Rounds half up; the quotient is below `mult`, so it fits in a u64.
            ((digits * u128::from(mult) + den / 2) / den) as u64
        }
    };
    whole_bytes.checked_add(frac_bytes).ok_or_else(out_of_range)
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
        assert_eq!(fmt_bytes(1023), "1023 B");
        assert_eq!(fmt_bytes(1024), "1.00 KiB");
        // PyTorch writes no TiB.
        assert_eq!(fmt_bytes(1 << 50), "1048576.00 GiB");
    }

    #[test]
    fn the_short_style_of_the_live_view_and_the_plots() {
        let short = |b: i128| format_bytes(b, ByteStyle::Short);
        assert_eq!(short(0), "0 B");
        assert_eq!(short(512), "512 B");
        assert_eq!(short(1536), "1.5 KiB");
        assert_eq!(short(334_399_488), "318.9 MiB");
        assert_eq!(short(24 << 30), "24.00 GiB");
        assert_eq!(short(23 * (1 << 30) + (1 << 29)), "23.50 GiB");
        assert_eq!(short(5 << 39), "2.50 TiB");
        assert_eq!(short(-(3 << 29)), "-1.50 GiB");
    }

    #[test]
    fn one_unit_for_a_column_or_an_axis() {
        assert_eq!(ByteUnit::GiB.format(3.0 * GIB, 0), "3 GiB");
        assert_eq!(ByteUnit::MiB.format(32.0 * MIB, 2), "32.00 MiB");
        assert_eq!(ByteUnit::MiB.number(334_399_488.0, 2), "318.91");
        assert_eq!(ByteUnit::B.format(512.0, 2), "512 B");
        assert_eq!(ByteUnit::for_bytes(-2.0 * GIB), ByteUnit::GiB);
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

    #[test]
    fn units_are_exact_integers() {
        assert_eq!(parse_bytes("24GiB"), Ok(25_769_803_776));
        assert_eq!(parse_bytes("1.5GiB"), Ok(1_610_612_736));
        assert_eq!(parse_bytes("23.5GiB"), Ok(25_232_932_864));
        assert_eq!(parse_bytes("23.5 gib"), Ok(47 << 29));
        assert_eq!(parse_bytes("141gb"), Ok(141_000_000_000));
        assert_eq!(parse_bytes("0.5KB"), Ok(500));
        assert_eq!(parse_bytes(".5K"), Ok(512));
        assert_eq!(parse_bytes("2.K"), Ok(2048));
        assert_eq!(parse_bytes("4096B"), Ok(4096));
        assert_eq!(parse_bytes("1TiB"), Ok(1 << 40));
        assert_eq!(parse_bytes("4_096 MiB"), Ok(4 << 30));
        // A value past 2^53 that a float would round: 16 EiB less one KiB, exactly.
        assert_eq!(parse_bytes("18014398509481983K"), Ok(u64::MAX - 1023));
        assert_eq!(parse_bytes("18446744073709551615"), Ok(u64::MAX));
        // Fractions of a byte round to the nearest byte, halves up.
        assert_eq!(parse_bytes("0.1KiB"), Ok(102));
        assert_eq!(parse_bytes("0.0005KB"), Ok(1));
        assert_eq!(parse_bytes("0.0004KB"), Ok(0));
    }

    #[test]
    fn bad_and_huge_counts_are_refused_not_wrapped() {
        for bad in ["", "GiB", "-1", ".", "1.2.3G", "1.5", "1.5B", "12 parsecs"] {
            assert!(parse_bytes(bad).is_err(), "{bad:?}");
        }
        for huge in [
            "18446744073709551616",
            "99999999999TiB",
            "16777216TiB",
            "17179869184GiB",
            "16777215.99999999999999999TiB",
            "99999999999999999999999G",
        ] {
            let e = parse_bytes(huge).unwrap_err();
            assert_eq!(e, ParseBytesError::OutOfRange(huge.to_string()));
            assert!(e.to_string().contains("out of range"), "{huge:?}: {e}");
        }
        let e = parse_bytes("1.0000000000000000001G").unwrap_err();
        assert!(matches!(e, ParseBytesError::TooPrecise(_)), "{e}");
        assert!(e.to_string().contains("18 digits"));
    }
}
