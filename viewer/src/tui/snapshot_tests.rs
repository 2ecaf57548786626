//! Snapshot tests: each panel and overlay rendered into a `TestBackend` for
//! one fixed state, compared line by line with what a user would see.

use ratatui::Terminal;
use ratatui::backend::TestBackend;
use ratatui::buffer::Buffer;
use ratatui::crossterm::event::{KeyCode, KeyEvent, KeyModifiers};
use ratatui::layout::Rect;

use crate::model::{
    BreakdownEntry, DeviceInfo, FailedAllocation, LiveAllocation, LiveSnapshot, NvmlPanel,
    NvmlProcess, ProcessInfo, TimelinePoint, Update,
};
use crate::tui::app::{App, ViewOptions};
use crate::tui::{breakdown, chart, header, largest, nvml, status};

const GIB: u64 = 1 << 30;
const MIB: u64 = 1 << 20;

/// Renders `draw` on a `width`×`height` test terminal and returns its lines.
fn render(width: u16, height: u16, draw: impl Fn(Rect, &mut Buffer)) -> Vec<String> {
    let mut terminal = Terminal::new(TestBackend::new(width, height)).unwrap();
    terminal
        .draw(|frame| draw(frame.area(), frame.buffer_mut()))
        .unwrap();
    let buffer = terminal.backend().buffer();
    (0..height)
        .map(|y| {
            (0..width)
                .map(|x| buffer[(x, y)].symbol())
                .collect::<String>()
        })
        .collect()
}

/// Compares rendered lines with the expected ones; on a mismatch prints the
/// actual lines ready to paste.
fn assert_lines(actual: Vec<String>, expected: &[&str]) {
    if actual != expected {
        let pasted: Vec<String> = actual.iter().map(|l| format!("        {l:?},")).collect();
        panic!("rendered lines differ; got:\n{}", pasted.join("\n"));
    }
}

fn key(app: &mut App, code: KeyCode) {
    app.on_key(KeyEvent::new(code, KeyModifiers::NONE));
}

fn allocation(size_bytes: u64, name: &str, age_s: f64, top: &str) -> LiveAllocation {
    LiveAllocation {
        size_bytes,
        name: name.into(),
        driver_function: "cuMemAlloc_v2".into(),
        age_s,
        top_frame: top.into(),
        stack: vec![
            "at::detail::empty_generic".into(),
            top.into(),
            "forward (model.py:88)".into(),
        ],
    }
}

/// Two processes on one 24 GiB device, live bytes climbing for 10 s to a
/// 20 GiB peak at 8 s, one failure at 9 s, NVML available.
fn app() -> App {
    let mut app = App::new(ViewOptions {
        title: "/tmp/run".into(),
        capacity_bytes: Some(24 * GIB),
        ..ViewOptions::default()
    });
    app.apply([
        Update::Process(ProcessInfo {
            pid: 4242,
            parent: Some(1),
            command: "vllm serve Qwen/Qwen3.6-27B".into(),
        }),
        Update::Process(ProcessInfo {
            pid: 4243,
            parent: Some(4242),
            command: "worker".into(),
        }),
        Update::Device(DeviceInfo {
            ordinal: 0,
            name: "NVIDIA H200".into(),
            total_bytes: 140 * GIB,
        }),
    ]);
    let gib = [2, 4, 6, 8, 10, 12, 14, 16, 20, 12, 12];
    app.apply(gib.iter().enumerate().map(|(t, g)| Update::Sample {
        device: 0,
        point: TimelinePoint::new(t as f64, g * GIB),
    }));
    app.apply([
        Update::Failure(FailedAllocation {
            time_s: 9.0,
            device: 0,
            pid: 4243,
            request_bytes: 6 * GIB,
            free_bytes: Some(4 * GIB),
            label: "gdn.h".into(),
            error: "CUDA_ERROR_OUT_OF_MEMORY".into(),
        }),
        Update::Nvml {
            device: 0,
            panel: NvmlPanel::Available {
                used_bytes: 13 * GIB + 512 * MIB,
                total_bytes: 140 * GIB,
                processes: vec![
                    NvmlProcess {
                        pid: 4242,
                        used_bytes: 7 * GIB,
                    },
                    NvmlProcess {
                        pid: 4243,
                        used_bytes: 6 * GIB + 512 * MIB,
                    },
                ],
            },
        },
        Update::Notice("skipped notes.txt: not a vramtrace trace".into()),
    ]);
    app.set_snapshot(Some(LiveSnapshot {
        time_s: 10.0,
        largest: vec![
            allocation(8 * GIB, "weights", 10.0, "load_weights (loader.py:12)"),
            allocation(3 * GIB, "kv_cache", 9.5, "allocate_kv (cache.py:40)"),
            allocation(GIB, "", 0.25, "chunk_fwd (chunk.py:77)"),
        ],
        breakdown: vec![
            BreakdownEntry {
                label: "weights".into(),
                bytes: 8 * GIB,
            },
            BreakdownEntry {
                label: "KV cache".into(),
                bytes: 3 * GIB,
            },
            BreakdownEntry {
                label: "unnamed".into(),
                bytes: GIB,
            },
        ],
        ..Default::default()
    }));
    app
}

#[test]
fn header_lists_processes_devices_peak_and_failures() {
    let app = app();
    assert_eq!(header::height(&app), 4);
    assert_lines(
        render(100, 4, |area, buf| header::render(&app, area, buf)),
        &[
            "Processes  all · 4242 vllm serve Qwen/Qwen3.6-27B · 4243 worker                                     ",
            "Devices    cuda:0 NVIDIA H200 (140.00 GiB)                                                          ",
            "Peak       20.00 GiB at 8.00 s on cuda:0   Failures 1                                               ",
            "  ✗ 9.00 s cuda:0 pid 4243 gdn.h: 6.00 GiB requested, 4.00 GiB free, CUDA_ERROR_OUT_OF_MEMORY       ",
        ],
    );
}

#[test]
fn nvml_panel_shows_untraced_bytes() {
    let app = app();
    assert_lines(
        render(25, 9, |area, buf| nvml::render(&app, area, buf)),
        &[
            "┌ NVML ─────────────────┐",
            "│used        13.50 GiB  │",
            "│total      140.00 GiB  │",
            "│traced      12.00 GiB  │",
            "│untraced     1.50 GiB  │",
            "│pid 4242     7.00 GiB  │",
            "│pid 4243     6.50 GiB  │",
            "│                       │",
            "└───────────────────────┘",
        ],
    );
}

#[test]
fn nvml_panel_says_when_nvml_is_unavailable() {
    let mut app = app();
    app.apply([Update::Nvml {
        device: 0,
        panel: NvmlPanel::Unavailable("libnvidia-ml.so.1 not found".into()),
    }]);
    assert_lines(
        render(25, 8, |area, buf| nvml::render(&app, area, buf)),
        &[
            "┌ NVML ─────────────────┐",
            "│NVML unavailable:      │",
            "│libnvidia-ml.so.1 not  │",
            "│found                  │",
            "│untraced memory unknown│",
            "│traced      12.00 GiB  │",
            "│                       │",
            "└───────────────────────┘",
        ],
    );
}

#[test]
fn timeline_marks_peak_failure_capacity_and_cursor() {
    let mut app = app();
    key(&mut app, KeyCode::Char('p'));
    assert_lines(
        render(60, 14, |area, buf| chart::render(&app, area, buf)),
        &[
            "┌ Live bytes, cuda:0 ──────────────────────────────────────┐",
            "│30 GiB│                                        ⢸          │",
            "│      │                                        ⢸          │",
            "│      │⠉⠉⠉⠉⠉⠉⠉⠉⠉⠉⠉⠉⠉⠉⠉⠉⠉⠉⠉⠉⠉⠉⠉⠉⠉⠉⠉⠉⠉⠉⠉⠉⠉⠉⠉⠉⠉⠉⠉⠉⢸⠉⠉⠉⠉⠉⠉⠉⠉⠉⠉│",
            "│      │                                      ⢀⡠•⢄         │",
            "│      │                                 ⢀⣀⠤⠔⠊⠁ ⢸ ⠑⢄       │",
            "│15 GiB│                         ⣀⣀⠤⠤⠔⠒⠊⠉⠁      ⢸   ⠑█⣀⣀⣀⣀⣀│",
            "│      │                  ⣀⡠⠤⠒⠒⠉⠉               ⢸          │",
            "│      │         ⢀⣀⡠⠤⠤⠒⠒⠉⠉                      ⢸          │",
            "│      │ ⢀⣀⣀⠤⠤⠒⠒⠉⠁                              ⢸          │",
            "│0     │⠉⠁                                      ⢸          │",
            "│      └───────────────────────────────────────────────────│",
            "│ 0.00 s                       5.00 s               10.00 s│",
            "└ ━ live  ━ capacity 24.00 GiB  • peak 20.00 GiB  █ failed ┘",
        ],
    );
}

#[test]
fn largest_live_table_highlights_the_selected_row() {
    let mut app = app();
    key(&mut app, KeyCode::Down);
    assert_lines(
        render(100, 6, |area, buf| largest::render(&app, area, buf)),
        &[
            "┌ Largest live at 10.00 s (cuda:0, all processes) ─────────────────────────────────────────────────┐",
            "│  Size       Name               Function           Age       Top frame                            │",
            "│    8.00 GiB weights            cuMemAlloc_v2        10.00 s load_weights (loader.py:12)          │",
            "│▶   3.00 GiB kv_cache           cuMemAlloc_v2         9.50 s allocate_kv (cache.py:40)            │",
            "│    1.00 GiB unnamed            cuMemAlloc_v2       250.0 ms chunk_fwd (chunk.py:77)              │",
            "└──────────────────────────────────────────────────────────────────────────────────────────────────┘",
        ],
    );
}

#[test]
fn breakdown_bar_is_proportional_with_a_legend() {
    let app = app();
    assert_lines(
        render(72, 4, |area, buf| breakdown::render(&app, area, buf)),
        &[
            "┌ Live by label at 10.00 s ────────────────────────────────────────────┐",
            "│███████████████████████████████████████████████▓▓▓▓▓▓▓▓▓▓▓▓▓▓▓▓▓▒▒▒▒▒▒│",
            "│█ weights 8.00 GiB 67%  ▓ KV cache 3.00 GiB 25%  ▒ unnamed 1.00 GiB 8%│",
            "└──────────────────────────────────────────────────────────────────────┘",
        ],
    );
}

#[test]
fn status_bar_shows_mode_filter_and_notice() {
    let mut app = app();
    key(&mut app, KeyCode::Char(' '));
    key(&mut app, KeyCode::Char('/'));
    key(&mut app, KeyCode::Char('k'));
    assert_lines(
        render(100, 1, |area, buf| status::render(&app, area, buf)),
        &[
            " PAUSED  t=10.00 s step 1.00 s /k▏ Enter keeps, Esc clears ? help  q quit │ /tmp/run │ skipped notes",
        ],
    );
}

#[test]
fn whole_screen() {
    let app = app();
    assert_lines(
        render(100, 30, |area, buf| (&app).render_into(area, buf)),
        &[
            "Processes  all · 4242 vllm serve Qwen/Qwen3.6-27B · 4243 worker                                     ",
            "Devices    cuda:0 NVIDIA H200 (140.00 GiB)                                                          ",
            "Peak       20.00 GiB at 8.00 s on cuda:0   Failures 1                                               ",
            "  ✗ 9.00 s cuda:0 pid 4243 gdn.h: 6.00 GiB requested, 4.00 GiB free, CUDA_ERROR_OUT_OF_MEMORY       ",
            "┌ Live bytes, cuda:0 ─────────────────────────────────────────────────────┐┌ NVML ─────────────────┐",
            "│30 GiB│                                                                  ││used        13.50 GiB  │",
            "│      │⣀⣀⣀⣀⣀⣀⣀⣀⣀⣀⣀⣀⣀⣀⣀⣀⣀⣀⣀⣀⣀⣀⣀⣀⣀⣀⣀⣀⣀⣀⣀⣀⣀⣀⣀⣀⣀⣀⣀⣀⣀⣀⣀⣀⣀⣀⣀⣀⣀⣀⣀⣀⣀⣀⣀⣀⣀⣀⣀⣀⣀⣀⣀⣀⣀⣀││total      140.00 GiB  │",
            "│      │                                                                  ││traced      12.00 GiB  │",
            "│      │                                               ⣀⡠⠤⠔⠒•⠒⢄⡀          ││untraced     1.50 GiB  │",
            "│15 GiB│                                      ⣀⣀⣀⠤⠤⠒⠒⠉⠉        ⠈⠢⢄        ││pid 4242     7.00 GiB  │",
            "│      │                         ⣀⣀⣀⠤⠤⠤⠔⠒⠒⠒⠉⠉⠉                    ⠉█⠒⠒⠒⠒⠒⠒││pid 4243     6.50 GiB  │",
            "│      │               ⣀⣀⣀⠤⠤⠤⠒⠒⠉⠉                                         ││                       │",
            "│      │   ⢀⣀⡠⠤⠤⠔⠒⠒⠊⠉⠉⠉                                                   ││                       │",
            "│0     │⠒⠊⠉⠁                                                              ││                       │",
            "│      └──────────────────────────────────────────────────────────────────││                       │",
            "│ 0.00 s                              5.00 s                       10.00 s││                       │",
            "└ ━ live  ━ capacity 24.00 GiB  • peak 20.00 GiB  █ failed ×1  ───────────┘└───────────────────────┘",
            "┌ Largest live at 10.00 s (cuda:0, all processes) ─────────────────────────────────────────────────┐",
            "│  Size       Name               Function           Age       Top frame                            │",
            "│▶   8.00 GiB weights            cuMemAlloc_v2        10.00 s load_weights (loader.py:12)          │",
            "│    3.00 GiB kv_cache           cuMemAlloc_v2         9.50 s allocate_kv (cache.py:40)            │",
            "│    1.00 GiB unnamed            cuMemAlloc_v2       250.0 ms chunk_fwd (chunk.py:77)              │",
            "│                                                                                                  │",
            "│                                                                                                  │",
            "└──────────────────────────────────────────────────────────────────────────────────────────────────┘",
            "┌ Live by label at 10.00 s ────────────────────────────────────────────────────────────────────────┐",
            "│█████████████████████████████████████████████████████████████████▓▓▓▓▓▓▓▓▓▓▓▓▓▓▓▓▓▓▓▓▓▓▓▓▓▒▒▒▒▒▒▒▒│",
            "│█ weights 8.00 GiB 67%  ▓ KV cache 3.00 GiB 25%  ▒ unnamed 1.00 GiB 8%                            │",
            "└──────────────────────────────────────────────────────────────────────────────────────────────────┘",
            " FOLLOW  t=10.00 s step 1.00 s ? help  q quit │ /tmp/run │ skipped notes.txt: not a vramtrace trace ",
        ],
    );
}

#[test]
fn help_overlay() {
    let mut app = app();
    key(&mut app, KeyCode::Char('?'));
    assert_lines(
        render(60, 20, |area, buf| (&app).render_into(area, buf)),
        &[
            "Processes  all · 4242 vllm serve Qwen/Qwen3.6-27B · 4243 wor",
            "Devices    cuda:0 NVIDIA H200 (140.00 GiB)                  ",
            "Peak  ┌ Keys ────────────────────────────────────────┐      ",
            "  ✗ 9.│ space     pause / follow the newest data     │4.00 G",
            "┌ Live│ f, End    follow                             │─────┐",
            "│30 Gi│ ← →       scrub back / forward one step      │GiB  │",
            "│15 Gi│ [ ]       halve / double the step            │GiB  │",
            "│     │ Home      go to the start                    │GiB  │",
            "│ 0.00│ p         jump to the peak                   │GiB  │",
            "└ ━ li│ n         jump to the next failure           │─────┘",
            "┌ Larg│ d         next device                        │─────┐",
            "│  Siz│ Tab       next process (then all)            │rame │",
            "│▶   8│ ↑ ↓, k j  select an allocation               │weigh│",
            "│    3│ Enter     show its full stack                │ate_k│",
            "│    1│ /         filter by label (Esc clears)       │_fwd │",
            "└─────│ ?, h      this help                          │─────┘",
            "┌ Live│ Esc       close / clear the filter           │─────┐",
            "│█████│ q         quit                               │▒▒▒▒▒│",
            "└─────└──────────────────────────────────────────────┘─────┘",
            " FOLLOW  t=10.00 s step 1.00 s ? help  q quit │ /tmp/run │ s",
        ],
    );
}

#[test]
fn stack_overlay_shows_the_selected_allocation() {
    let mut app = app();
    key(&mut app, KeyCode::Enter);
    assert_lines(
        render(60, 20, |area, buf| (&app).render_into(area, buf)),
        &[
            "Processes  all · 4242 vllm serve Qwen/Qwen3.6-27B · 4243 wor",
            "Devices    cuda:0 NVIDIA H200 (140.00 GiB)                  ",
            "Pea┌ weights: 8.00 GiB by cuMemAlloc_v2, live 10.00 s ──┐   ",
            "  ✗│#0  at::detail::empty_generic                       │0 G",
            "┌ L│#1  load_weights (loader.py:12)                     │──┐",
            "│30│#2  forward (model.py:88)                           │  │",
            "│15│                                                    │  │",
            "│  │                                                    │  │",
            "│ 0│                                                    │  │",
            "└ ━│                                                    │──┘",
            "┌ L│                                                    │──┐",
            "│  │                                                    │e │",
            "│▶ │                                                    │gh│",
            "│  │                                                    │_k│",
            "│  │                                                    │d │",
            "└──│                                                    │──┘",
            "┌ L│                                                    │──┐",
            "│██└ Esc closes ────────────────────────────────────────┘▒▒│",
            "└──────────────────────────────────────────────────────────┘",
            " FOLLOW  t=10.00 s step 1.00 s ? help  q quit │ /tmp/run │ s",
        ],
    );
}

#[test]
fn empty_view_waits_and_a_small_terminal_gets_a_message() {
    let app = App::new(ViewOptions::default());
    assert_lines(
        render(60, 20, |area, buf| (&app).render_into(area, buf)),
        &[
            "Processes  none yet                                         ",
            "Devices    none yet: waiting for the first trace            ",
            "Peak       no samples yet   Failures 0                      ",
            "┌ Live bytes ─────────────────────┐┌ NVML ─────────────────┐",
            "│         no samples yet          ││no NVML reading yet    │",
            "│                                 ││traced              –  │",
            "│                                 ││                       │",
            "│                                 ││                       │",
            "└─────────────────────────────────┘└───────────────────────┘",
            "┌ Largest live at 0.00 s (all processes) ──────────────────┐",
            "│              no snapshot from the trace yet              │",
            "│                                                          │",
            "│                                                          │",
            "│                                                          │",
            "│                                                          │",
            "└──────────────────────────────────────────────────────────┘",
            "┌ Live by label at 0.00 s ─────────────────────────────────┐",
            "│                 nothing to break down yet                │",
            "└──────────────────────────────────────────────────────────┘",
            " FOLLOW  t=0.00 s step 1.00 s ? help  q quit                ",
        ],
    );
    assert_lines(
        render(30, 5, |area, buf| (&app).render_into(area, buf)),
        &[
            "The terminal is 30×5; the live",
            "  view needs at least 60×20.  ",
            "   Enlarge it, or press q to  ",
            "             quit.            ",
            "                              ",
        ],
    );
}

/// `Widget::render` for `&App` under a name that reads well in a closure.
trait RenderInto {
    fn render_into(self, area: Rect, buf: &mut Buffer);
}

impl RenderInto for &App {
    fn render_into(self, area: Rect, buf: &mut Buffer) {
        ratatui::widgets::Widget::render(self, area, buf);
    }
}
