//! The live view's state and its key handling, free of any terminal.

use std::collections::VecDeque;

use ratatui::crossterm::event::{KeyCode, KeyEvent, KeyEventKind, KeyModifiers};

use crate::model::{
    DeviceInfo, FailedAllocation, LiveAllocation, LiveSnapshot, NvmlPanel, ProcessInfo,
    SnapshotQuery, Update,
};
use crate::{DEFAULT_MAX_POINTS, Timeline};

/// Ticks a new failure stays highlighted in the header.
pub const FLASH_TICKS: u32 = 10;

/// Status-bar notices kept (the newest is shown).
const MAX_NOTICES: usize = 8;

const MIN_STEP_S: f64 = 0.001;
const MAX_STEP_S: f64 = 3600.0;

/// Whether the cursor follows the newest data or stays where it was put.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// The cursor is the newest time; the view moves with the trace.
    Follow,
    /// The cursor stays at a chosen time while data keeps arriving.
    Paused,
}

/// What is drawn over the panels, if anything.
#[derive(Debug, Clone, PartialEq)]
pub enum Overlay {
    /// Nothing: the panels are visible.
    None,
    /// The key list.
    Help,
    /// The full stack of one allocation (copied, so it stays while the view moves).
    Stack(Box<LiveAllocation>),
    /// The label filter is being typed.
    FilterInput,
}

/// What the table under the timeline lists (the `t` key cycles through them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Table {
    /// The largest live allocations (tensors when they were recorded).
    Largest,
    /// The live tensors grouped by Python line.
    ByLine,
    /// The whole-step model's parts beside the observed categories (with `--model`).
    Model,
    /// The modelled step's tensors beside the live allocations they match (with `--model`).
    Tensors,
    /// What grows over the run so far, by line, with the verdict as it stands.
    Growth,
}

impl Table {
    /// The table's name in the status line.
    pub fn name(self) -> &'static str {
        match self {
            Table::Largest => "largest",
            Table::ByLine => "lines",
            Table::Model => "model",
            Table::Tensors => "tensors",
            Table::Growth => "growth",
        }
    }
}

/// What the event loop should do after a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// The key changed nothing.
    None,
    /// The state changed: draw again.
    Redraw,
    /// Leave the view.
    Quit,
}

/// Settings of the live view.
#[derive(Debug, Clone, PartialEq)]
pub struct ViewOptions {
    /// Shown in the status bar, e.g. the trace directory.
    pub title: String,
    /// Points each device's timeline keeps (see [`Timeline`]).
    pub max_points: usize,
    /// The first scrub step in seconds (`[` and `]` halve and double it).
    pub step_s: f64,
    /// A capacity line drawn on every device's timeline.
    pub capacity_bytes: Option<u64>,
    /// The predicted peak drawn on every device's timeline.
    pub predicted_peak_bytes: Option<u64>,
}

impl Default for ViewOptions {
    fn default() -> Self {
        Self {
            title: String::new(),
            max_points: DEFAULT_MAX_POINTS,
            step_s: 1.0,
            capacity_bytes: None,
            predicted_peak_bytes: None,
        }
    }
}

/// One device's state in the view.
#[derive(Debug, Clone, PartialEq)]
pub struct DeviceView {
    /// The device.
    pub info: DeviceInfo,
    /// Its live bytes over time.
    pub timeline: Timeline,
    /// The latest NVML reading, if any came.
    pub nvml: Option<NvmlPanel>,
}

/// The live view: everything rendering needs, changed only by
/// [`App::apply`], [`App::on_key`], [`App::tick`] and [`App::set_snapshot`].
#[derive(Debug, Clone, PartialEq)]
pub struct App {
    options: ViewOptions,
    mode: Mode,
    overlay: Overlay,
    processes: Vec<ProcessInfo>,
    devices: Vec<DeviceView>,
    device_index: usize,
    process_index: Option<usize>,
    cursor_s: f64,
    step_s: f64,
    filter: String,
    selected_row: usize,
    snapshot: Option<LiveSnapshot>,
    notices: VecDeque<String>,
    flash_ticks: u32,
    exited: std::collections::BTreeSet<u32>,
    table: Table,
}

impl App {
    /// An empty view: it says it is waiting until the first update arrives.
    pub fn new(options: ViewOptions) -> Self {
        let step_s = options.step_s.clamp(MIN_STEP_S, MAX_STEP_S);
        Self {
            options,
            mode: Mode::Follow,
            overlay: Overlay::None,
            processes: Vec::new(),
            devices: Vec::new(),
            device_index: 0,
            process_index: None,
            cursor_s: 0.0,
            step_s,
            filter: String::new(),
            selected_row: 0,
            snapshot: None,
            notices: VecDeque::new(),
            flash_ticks: 0,
            exited: std::collections::BTreeSet::new(),
            table: Table::Largest,
        }
    }

    /// Takes in updates from the source.
    pub fn apply(&mut self, updates: impl IntoIterator<Item = Update>) {
        for update in updates {
            self.apply_one(update);
        }
    }

    fn apply_one(&mut self, update: Update) {
        match update {
            Update::Process(p) => match self.processes.binary_search_by_key(&p.pid, |q| q.pid) {
                Ok(i) => self.processes[i] = p,
                Err(i) => {
                    self.processes.insert(i, p);
                    // Keep the selected process selected when one is inserted before it.
                    if let Some(sel) = self.process_index.as_mut()
                        && *sel >= i
                    {
                        *sel += 1;
                    }
                }
            },
            Update::Device(info) => {
                let i = self.device_slot(info.ordinal);
                self.devices[i].info = info;
            }
            Update::Categories { device, names } => {
                let i = self.device_slot(device);
                self.devices[i].timeline.set_categories(names);
            }
            Update::Sample { device, point } => {
                let i = self.device_slot(device);
                self.devices[i].timeline.push(point);
            }
            Update::Failure(f) => {
                let i = self.device_slot(f.device);
                self.devices[i].timeline.push_failure(f);
                self.flash_ticks = FLASH_TICKS;
            }
            Update::Nvml { device, panel } => {
                let i = self.device_slot(device);
                self.devices[i].nvml = Some(panel);
            }
            Update::Notice(text) => {
                if self.notices.len() == MAX_NOTICES {
                    self.notices.pop_front();
                }
                self.notices.push_back(text);
            }
            Update::Exited { pid } => {
                self.exited.insert(pid);
            }
        }
    }

    /// The index of a device's state, created on first sight. Devices stay
    /// sorted by ordinal; the selection follows its device.
    fn device_slot(&mut self, ordinal: u32) -> usize {
        match self
            .devices
            .binary_search_by_key(&ordinal, |d| d.info.ordinal)
        {
            Ok(i) => i,
            Err(i) => {
                let timeline = Timeline::new(self.options.max_points)
                    .with_capacity_bytes(self.options.capacity_bytes)
                    .with_predicted_peak_bytes(self.options.predicted_peak_bytes);
                self.devices.insert(
                    i,
                    DeviceView {
                        info: DeviceInfo {
                            ordinal,
                            name: String::new(),
                            total_bytes: 0,
                        },
                        timeline,
                        nvml: None,
                    },
                );
                if i <= self.device_index && self.devices.len() > 1 {
                    self.device_index += 1;
                }
                i
            }
        }
    }

    /// Advances time-based effects (the failure flash) by one tick.
    pub fn tick(&mut self) {
        self.flash_ticks = self.flash_ticks.saturating_sub(1);
    }

    /// Stores the source's answer to [`App::snapshot_query`].
    pub fn set_snapshot(&mut self, snapshot: Option<LiveSnapshot>) {
        self.snapshot = snapshot;
        let rows = self.table_rows();
        self.selected_row = self.selected_row.min(rows.saturating_sub(1));
    }

    /// The snapshot the view needs now: selected device and process at the cursor.
    pub fn snapshot_query(&self) -> Option<SnapshotQuery> {
        let device = self.device()?;
        Some(SnapshotQuery {
            device: device.info.ordinal,
            pid: self.process().map(|p| p.pid),
            time_s: self.cursor_time(),
        })
    }

    /// Handles one key press; releases and repeats of other kinds are ignored.
    pub fn on_key(&mut self, key: KeyEvent) -> Action {
        if key.kind != KeyEventKind::Press {
            return Action::None;
        }
        if key.modifiers.contains(KeyModifiers::CONTROL) && key.code == KeyCode::Char('c') {
            return Action::Quit;
        }
        match self.overlay {
            Overlay::FilterInput => return self.on_filter_key(key.code),
            Overlay::Help | Overlay::Stack(_) => {
                return match key.code {
                    KeyCode::Char('q') => Action::Quit,
                    KeyCode::Esc | KeyCode::Enter | KeyCode::Char('?') | KeyCode::Char('h') => {
                        self.overlay = Overlay::None;
                        Action::Redraw
                    }
                    _ => Action::None,
                };
            }
            Overlay::None => {}
        }
        match key.code {
            KeyCode::Char('q') => return Action::Quit,
            KeyCode::Esc if !self.filter.is_empty() => {
                self.filter.clear();
                self.selected_row = 0;
            }
            KeyCode::Esc => return Action::Quit,
            KeyCode::Char(' ') => match self.mode {
                Mode::Follow => self.pause_at(self.latest_time()),
                Mode::Paused => self.mode = Mode::Follow,
            },
            KeyCode::Char('f') | KeyCode::End => self.mode = Mode::Follow,
            KeyCode::Left => self.pause_at(self.cursor_time() - self.step_s),
            KeyCode::Right => self.pause_at(self.cursor_time() + self.step_s),
            KeyCode::Home => self.pause_at(f64::NEG_INFINITY),
            KeyCode::Char('[') => self.step_s = (self.step_s / 2.0).max(MIN_STEP_S),
            KeyCode::Char(']') => self.step_s = (self.step_s * 2.0).min(MAX_STEP_S),
            // With a reserve (PyTorch's cached segments) the peak of the bytes in use: the
            // live bytes plateau while the tensors in the segments come and go.
            KeyCode::Char('p') => match self
                .device()
                .and_then(|d| d.timeline.in_use_peak().or(d.timeline.peak()))
            {
                Some(peak) => self.pause_at(peak.time_s),
                None => return Action::None,
            },
            KeyCode::Char('n') => match self.next_failure_time() {
                Some(t) => self.pause_at(t),
                None => return Action::None,
            },
            KeyCode::Char('d') if self.devices.len() > 1 => {
                self.device_index = (self.device_index + 1) % self.devices.len();
                self.selected_row = 0;
            }
            KeyCode::Tab if !self.processes.is_empty() => {
                self.process_index = match self.process_index {
                    None => Some(0),
                    Some(i) if i + 1 < self.processes.len() => Some(i + 1),
                    Some(_) => None,
                };
                self.selected_row = 0;
            }
            KeyCode::Up | KeyCode::Char('k') => {
                self.selected_row = self.selected_row.saturating_sub(1)
            }
            KeyCode::Down | KeyCode::Char('j') => {
                let rows = self.table_rows();
                self.selected_row = (self.selected_row + 1).min(rows.saturating_sub(1));
            }
            KeyCode::Enter if self.table != Table::Largest => return Action::None,
            KeyCode::Enter => match self.selected_allocation() {
                Some(a) => self.overlay = Overlay::Stack(Box::new(a.clone())),
                None => return Action::None,
            },
            KeyCode::Char('t') => {
                let model = self.snapshot.as_ref().is_some_and(|s| s.model.is_some());
                self.table = match self.table {
                    Table::Largest => Table::ByLine,
                    Table::ByLine if model => Table::Model,
                    Table::Model if model => Table::Tensors,
                    Table::ByLine | Table::Model | Table::Tensors => Table::Growth,
                    Table::Growth => Table::Largest,
                };
                self.selected_row = 0;
            }
            KeyCode::Char('/') => self.overlay = Overlay::FilterInput,
            KeyCode::Char('?') | KeyCode::Char('h') => self.overlay = Overlay::Help,
            _ => return Action::None,
        }
        Action::Redraw
    }

    fn on_filter_key(&mut self, code: KeyCode) -> Action {
        match code {
            KeyCode::Char(c) => self.filter.push(c),
            KeyCode::Backspace => {
                self.filter.pop();
            }
            KeyCode::Enter => self.overlay = Overlay::None,
            KeyCode::Esc => {
                self.filter.clear();
                self.overlay = Overlay::None;
            }
            _ => return Action::None,
        }
        self.selected_row = 0;
        Action::Redraw
    }

    /// Pauses with the cursor at `time_s`, clamped to the selected device's data.
    fn pause_at(&mut self, time_s: f64) {
        self.mode = Mode::Paused;
        self.cursor_s = match self.device().and_then(|d| d.timeline.time_range()) {
            Some((start, end)) => time_s.clamp(start, end),
            None => 0.0,
        };
    }

    /// The first failure after the cursor on the selected device that passes
    /// the process and label filters, wrapping to the first one.
    fn next_failure_time(&self) -> Option<f64> {
        let now = self.cursor_time();
        let mut times: Vec<f64> = self.visible_failures().map(|f| f.time_s).collect();
        times.sort_by(f64::total_cmp);
        times
            .iter()
            .copied()
            .find(|&t| t > now)
            .or(times.first().copied())
    }

    /// Newest time on the selected device (0 before any data).
    pub fn latest_time(&self) -> f64 {
        self.device()
            .and_then(|d| d.timeline.time_range())
            .map_or(0.0, |(_, end)| end)
    }

    /// The time the view describes: the newest in [`Mode::Follow`], the cursor when paused.
    pub fn cursor_time(&self) -> f64 {
        match self.mode {
            Mode::Follow => self.latest_time(),
            Mode::Paused => self.cursor_s,
        }
    }

    /// Follow or paused.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// The overlay drawn over the panels.
    pub fn overlay(&self) -> &Overlay {
        &self.overlay
    }

    /// The scrub step in seconds.
    pub fn step_s(&self) -> f64 {
        self.step_s
    }

    /// The label filter (case-insensitive substring); empty shows everything.
    pub fn filter(&self) -> &str {
        &self.filter
    }

    /// Whether a failure arrived within the last [`FLASH_TICKS`] ticks.
    pub fn flashing(&self) -> bool {
        self.flash_ticks > 0
    }

    /// The view's settings.
    pub fn options(&self) -> &ViewOptions {
        &self.options
    }

    /// All processes, by pid.
    pub fn processes(&self) -> &[ProcessInfo] {
        &self.processes
    }

    /// Whether the traced process `pid` has exited.
    pub fn exited(&self, pid: u32) -> bool {
        self.exited.contains(&pid)
    }

    /// Whether every traced process the view is about (the selected one, or all) has exited.
    pub fn all_exited(&self) -> bool {
        match self.process() {
            Some(p) => self.exited(p.pid),
            None => !self.processes.is_empty() && self.processes.iter().all(|p| self.exited(p.pid)),
        }
    }

    /// What the table under the timeline lists.
    pub fn table(&self) -> Table {
        self.table
    }

    /// The selected process, or `None` for all processes.
    pub fn process(&self) -> Option<&ProcessInfo> {
        self.processes.get(self.process_index?)
    }

    /// All devices, by ordinal.
    pub fn devices(&self) -> &[DeviceView] {
        &self.devices
    }

    /// The selected device, if any has been seen.
    pub fn device(&self) -> Option<&DeviceView> {
        self.devices.get(self.device_index)
    }

    /// The newest notice for the status bar.
    pub fn notice(&self) -> Option<&str> {
        self.notices.back().map(String::as_str)
    }

    /// The last snapshot the source gave.
    pub fn snapshot(&self) -> Option<&LiveSnapshot> {
        self.snapshot.as_ref()
    }

    /// Index of the selected row of the table shown.
    pub fn selected_row(&self) -> usize {
        self.selected_row
    }

    /// Rows of the table shown (what the selection moves over).
    fn table_rows(&self) -> usize {
        let snap = self.snapshot.as_ref();
        let model = snap.and_then(|s| s.model.as_ref());
        match self.table {
            Table::Largest => self.visible_largest().len(),
            Table::ByLine => snap.map_or(0, |s| {
                s.by_line
                    .iter()
                    .filter(|g| self.matches_filter(&g.line))
                    .count()
            }),
            Table::Model => model.map_or(0, |m| m.parts.len()),
            Table::Tensors => model
                .and_then(|m| m.tensors.as_ref().ok())
                .map_or(0, |t| t.rows.len()),
            Table::Growth => snap
                .and_then(|s| s.growth.as_ref())
                .map_or(0, |g| g.lines.len()),
        }
    }

    /// Whether a label passes the filter.
    pub fn matches_filter(&self, label: &str) -> bool {
        self.filter.is_empty() || label.to_lowercase().contains(&self.filter.to_lowercase())
    }

    /// The snapshot's largest allocations that pass the filter.
    pub fn visible_largest(&self) -> Vec<&LiveAllocation> {
        self.snapshot
            .iter()
            .flat_map(|s| &s.largest)
            .filter(|a| self.matches_filter(&a.name))
            .collect()
    }

    /// The allocation Enter would open.
    pub fn selected_allocation(&self) -> Option<&LiveAllocation> {
        self.visible_largest().get(self.selected_row).copied()
    }

    /// Failures on the selected device that pass the process and label filters.
    pub fn visible_failures(&self) -> impl Iterator<Item = &FailedAllocation> {
        let pid = self.process().map(|p| p.pid);
        self.device()
            .into_iter()
            .flat_map(|d| d.timeline.failures())
            .filter(move |f| pid.is_none_or(|pid| f.pid == pid) && self.matches_filter(&f.label))
    }

    /// Failures on all devices (for the header), as kept by the timelines.
    pub fn all_failures(&self) -> impl Iterator<Item = &FailedAllocation> {
        self.devices.iter().flat_map(|d| d.timeline.failures())
    }

    /// Failures on all devices, counted beyond those kept.
    pub fn failures_total(&self) -> u64 {
        self.devices
            .iter()
            .map(|d| d.timeline.failures_total())
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::TimelinePoint;

    fn key(code: KeyCode) -> KeyEvent {
        KeyEvent::new(code, KeyModifiers::NONE)
    }

    fn failure(time_s: f64, pid: u32, label: &str) -> FailedAllocation {
        FailedAllocation {
            time_s,
            device: 0,
            pid,
            request_bytes: 1 << 30,
            free_bytes: None,
            label: label.into(),
            error: "CUDA_ERROR_OUT_OF_MEMORY".into(),
        }
    }

    /// Device 0 with samples every second from 0 to 10 s peaking at 6 s,
    /// failures at 3 s (pid 2, `act`) and 7 s (pid 1, `kv`).
    fn app() -> App {
        let mut app = App::new(ViewOptions::default());
        app.apply([
            Update::Process(ProcessInfo {
                pid: 1,
                parent: None,
                command: "a".into(),
            }),
            Update::Process(ProcessInfo {
                pid: 2,
                parent: Some(1),
                command: "b".into(),
            }),
        ]);
        app.apply((0..=10).map(|i| Update::Sample {
            device: 0,
            point: TimelinePoint::new(i as f64, if i == 6 { 900 } else { 100 + i }),
        }));
        app.apply([
            Update::Failure(failure(7.0, 1, "kv")),
            Update::Failure(failure(3.0, 2, "act")),
        ]);
        app
    }

    #[test]
    fn scrubbing_pauses_and_stays_within_the_data() {
        let mut app = app();
        assert_eq!(app.mode(), Mode::Follow);
        assert_eq!(app.cursor_time(), 10.0);
        assert_eq!(app.on_key(key(KeyCode::Right)), Action::Redraw);
        assert_eq!(app.mode(), Mode::Paused);
        assert_eq!(app.cursor_time(), 10.0);
        app.on_key(key(KeyCode::Left));
        assert_eq!(app.cursor_time(), 9.0);
        app.on_key(key(KeyCode::Char('[')));
        app.on_key(key(KeyCode::Left));
        assert_eq!(app.cursor_time(), 8.5);
        for _ in 0..40 {
            app.on_key(key(KeyCode::Left));
        }
        assert_eq!(app.cursor_time(), 0.0);
        app.on_key(key(KeyCode::Char(' ')));
        assert_eq!(app.mode(), Mode::Follow);
        assert_eq!(app.cursor_time(), 10.0);
        // New data moves a following cursor, not a paused one.
        app.on_key(key(KeyCode::Home));
        app.apply([Update::Sample {
            device: 0,
            point: TimelinePoint::new(11.0, 5),
        }]);
        assert_eq!(app.cursor_time(), 0.0);
        app.on_key(key(KeyCode::Char('f')));
        assert_eq!(app.cursor_time(), 11.0);
    }

    #[test]
    fn jumps_to_the_peak_and_through_the_failures() {
        let mut app = app();
        app.on_key(key(KeyCode::Char('p')));
        assert_eq!((app.mode(), app.cursor_time()), (Mode::Paused, 6.0));
        app.on_key(key(KeyCode::Char('n')));
        assert_eq!(app.cursor_time(), 7.0);
        // Past the last failure it wraps to the first.
        app.on_key(key(KeyCode::Char('n')));
        assert_eq!(app.cursor_time(), 3.0);
        app.on_key(key(KeyCode::Char('n')));
        assert_eq!(app.cursor_time(), 7.0);
        // Only pid 2's failure when pid 2 is selected (Tab: all → 1 → 2).
        app.on_key(key(KeyCode::Tab));
        app.on_key(key(KeyCode::Tab));
        assert_eq!(app.process().map(|p| p.pid), Some(2));
        app.on_key(key(KeyCode::Char('n')));
        assert_eq!(app.cursor_time(), 3.0);
        app.on_key(key(KeyCode::Tab));
        assert_eq!(app.process(), None);
        assert_eq!(app.snapshot_query().unwrap().pid, None);
    }

    #[test]
    fn without_data_jumps_do_nothing() {
        let mut app = App::new(ViewOptions::default());
        assert_eq!(app.on_key(key(KeyCode::Char('p'))), Action::None);
        assert_eq!(app.on_key(key(KeyCode::Char('n'))), Action::None);
        assert_eq!(app.on_key(key(KeyCode::Enter)), Action::None);
        assert_eq!(app.snapshot_query(), None);
        assert_eq!(app.on_key(key(KeyCode::Left)), Action::Redraw);
        assert_eq!(app.cursor_time(), 0.0);
    }

    #[test]
    fn filter_is_typed_and_narrows_failures_and_rows() {
        let mut app = app();
        app.set_snapshot(Some(LiveSnapshot {
            time_s: 10.0,
            largest: ["weights.0", "kv_cache", "KV_extra"]
                .iter()
                .map(|n| LiveAllocation {
                    size_bytes: 1,
                    name: n.to_string(),
                    driver_function: "cuMemAlloc_v2".into(),
                    age_s: 0.0,
                    top_frame: String::new(),
                    stack: vec![format!("frame of {n}")],
                })
                .collect(),
            breakdown: Vec::new(),
            ..Default::default()
        }));
        app.on_key(key(KeyCode::Char('/')));
        assert_eq!(app.overlay(), &Overlay::FilterInput);
        // Typing `q` in the filter does not quit.
        for c in "kvq".chars() {
            assert_eq!(app.on_key(key(KeyCode::Char(c))), Action::Redraw);
        }
        app.on_key(key(KeyCode::Backspace));
        assert_eq!(app.on_key(key(KeyCode::Enter)), Action::Redraw);
        assert_eq!(app.filter(), "kv");
        assert_eq!(app.overlay(), &Overlay::None);
        let names: Vec<_> = app
            .visible_largest()
            .iter()
            .map(|a| a.name.as_str())
            .collect();
        assert_eq!(names, ["kv_cache", "KV_extra"]);
        assert_eq!(app.visible_failures().count(), 1);
        app.on_key(key(KeyCode::Down));
        app.on_key(key(KeyCode::Down));
        assert_eq!(app.selected_row(), 1);
        app.on_key(key(KeyCode::Enter));
        match app.overlay() {
            Overlay::Stack(a) => assert_eq!(a.stack, ["frame of KV_extra"]),
            other => panic!("expected the stack overlay, got {other:?}"),
        }
        app.on_key(key(KeyCode::Esc));
        assert_eq!(app.overlay(), &Overlay::None);
        // Esc clears the filter, a second Esc quits.
        app.on_key(key(KeyCode::Esc));
        assert_eq!(app.filter(), "");
        assert_eq!(app.on_key(key(KeyCode::Esc)), Action::Quit);
    }

    #[test]
    fn help_devices_quit_and_flash() {
        let mut app = app();
        assert!(app.flashing());
        for _ in 0..FLASH_TICKS {
            app.tick();
        }
        assert!(!app.flashing());
        app.on_key(key(KeyCode::Char('?')));
        assert_eq!(app.overlay(), &Overlay::Help);
        assert_eq!(app.on_key(key(KeyCode::Char('?'))), Action::Redraw);
        assert_eq!(app.overlay(), &Overlay::None);
        // One device: `d` does nothing; a second one appears and `d` selects it.
        assert_eq!(app.on_key(key(KeyCode::Char('d'))), Action::None);
        app.apply([Update::Sample {
            device: 3,
            point: TimelinePoint::new(0.5, 1),
        }]);
        assert_eq!(app.device().unwrap().info.ordinal, 0);
        app.on_key(key(KeyCode::Char('d')));
        assert_eq!(app.snapshot_query().unwrap().device, 3);
        assert_eq!(app.snapshot_query().unwrap().time_s, 0.5);
        assert_eq!(app.on_key(key(KeyCode::Char('c'))), Action::None);
        assert_eq!(
            app.on_key(KeyEvent::new(KeyCode::Char('c'), KeyModifiers::CONTROL)),
            Action::Quit
        );
        assert_eq!(app.on_key(key(KeyCode::Char('q'))), Action::Quit);
    }
}
