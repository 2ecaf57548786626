//! The plots' one font, colours and axis helpers.

use std::sync::OnceLock;

use plotters::style::{FontStyle, RGBColor, TextStyle, register_font};

use crate::units::{ByteUnit, nice_ceil};

/// The family name the embedded font is registered under.
pub const FONT: &str = "sans-serif";

/// Canvas background.
pub const BACKGROUND: RGBColor = RGBColor(255, 255, 255);
/// Axis, text and the total live-bytes line.
pub const INK: RGBColor = RGBColor(30, 30, 30);
/// Grid lines.
pub const GRID: RGBColor = RGBColor(225, 225, 225);
/// The capacity line.
pub const CAPACITY: RGBColor = RGBColor(200, 30, 30);
/// The model's prediction (predicted peak, predicted bars, the model curve).
pub const PREDICTED: RGBColor = RGBColor(230, 130, 0);
/// Observed values (observed bars and points).
pub const OBSERVED: RGBColor = RGBColor(30, 110, 200);
/// The peak marker.
pub const PEAK: RGBColor = RGBColor(150, 30, 160);
/// Failed allocations.
pub const FAILURE: RGBColor = RGBColor(220, 0, 0);

/// Fills of stacked categories, in order: twelve distinct ones, as many as the categoriser has
/// (a plot that used six had weights and "context and modules" in the same blue).
pub const CATEGORY_FILLS: [RGBColor; 12] = [
    RGBColor(110, 160, 220),
    RGBColor(240, 170, 90),
    RGBColor(130, 195, 120),
    RGBColor(200, 140, 200),
    RGBColor(160, 160, 160),
    RGBColor(230, 210, 100),
    RGBColor(110, 200, 205),
    RGBColor(230, 125, 125),
    RGBColor(175, 135, 95),
    RGBColor(150, 150, 235),
    RGBColor(95, 145, 95),
    RGBColor(245, 195, 215),
];

/// Registers the embedded DejaVu Sans once per process.
pub fn register_fonts() -> Result<(), String> {
    static REGISTERED: OnceLock<Result<(), String>> = OnceLock::new();
    REGISTERED
        .get_or_init(|| {
            let err = |_| "the embedded DejaVu Sans font could not be loaded".to_string();
            register_font(FONT, FontStyle::Normal, dejavu::sans::regular()).map_err(err)?;
            register_font(FONT, FontStyle::Bold, dejavu::sans::bold()).map_err(err)
        })
        .clone()
}

/// Text in the embedded font.
pub fn text(size: f64) -> TextStyle<'static> {
    TextStyle::from((FONT, size))
}

/// Bold text in the embedded font.
pub fn bold(size: f64) -> TextStyle<'static> {
    TextStyle::from((FONT, size, FontStyle::Bold))
}

/// The unit and the rounded top of a byte axis that must show `max_bytes`.
pub fn byte_axis(max_bytes: u64) -> (ByteUnit, f64) {
    let top = (max_bytes.max(1) as f64) * 1.08;
    let unit = ByteUnit::for_bytes(top);
    let step = nice_ceil(top / unit.bytes() / 5.0);
    (unit, (top / unit.bytes() / step).ceil() * step)
}

/// An axis label in `unit`: `12 GiB`, `2.5 GiB`.
pub fn byte_label(value: f64, unit: ByteUnit) -> String {
    let s = format!("{value:.2}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    format!("{s} {}", unit.symbol())
}
