//! The live terminal view: an [`App`] fed by a [`LiveSource`], drawn with
//! ratatui, one module per panel.

mod app;
mod breakdown;
mod chart;
mod header;
mod help;
mod largest;
mod nvml;
mod run;
mod stack;
mod status;
pub(crate) mod tables;
mod theme;
mod ui;

#[cfg(test)]
mod snapshot_tests;

pub use app::{Action, App, DeviceView, FLASH_TICKS, Mode, Overlay, Table, ViewOptions};
pub use help::KEYS;
pub use run::{KeyInput, RunOptions, TerminalKeys, run, run_loop};
pub use tables::forecast_text;
pub use ui::{MIN_HEIGHT, MIN_WIDTH};
/// What feeds the view, from `vramtrace-view-model` (viewer/model/).
pub use vramtrace_view_model::{LiveSource, ScriptedSource};
