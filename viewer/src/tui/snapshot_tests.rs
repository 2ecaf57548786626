//! Snapshot tests: each panel and overlay rendered into a `TestBackend` for
//! one fixed state, compared line by line with what a user would see.

use ratatui::Terminal;
use ratatui::backend::TestBackend;
use ratatui::buffer::Buffer;
use ratatui::crossterm::event::{KeyCode, KeyEvent, KeyModifiers};
use ratatui::layout::Rect;

use crate::model::{
    BreakdownEntry, DeviceInfo, FailedAllocation, Forecast, LineGroup, LiveAllocation,
    LiveSnapshot, ModelAtCursor, ModelPart, ModelTensor, ModelTensors, NvmlPanel, NvmlProcess,
    ProcessInfo, TimelinePoint, Update,
};
use crate::tui::app::{App, ViewOptions};
use crate::tui::tables::forecast_text;
use crate::tui::{breakdown, chart, header, largest, nvml, status, tables};

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
            " PAUSED  t=10.00 s step 1.00 s /k▏ Enter keeps, Esc clears t:largest  ? help  q quit │ /tmp/run │ sk",
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
            " FOLLOW  t=10.00 s step 1.00 s t:largest  ? help  q quit │ /tmp/run │ skipped notes.txt: not a vramt",
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
            "Dev┌ Keys ──────────────────────────────────────────────┐   ",
            "Pea│ space     pause / follow the newest data           │   ",
            "  ✗│ f, End    follow                                   │0 G",
            "┌ L│ ← →       scrub back / forward one step            │──┐",
            "│30│ [ ]       halve / double the step                  │  │",
            "│15│ Home      go to the start                          │  │",
            "│  │ p         jump to the peak of bytes in use         │  │",
            "│ 0│ n         jump to the next failure                 │  │",
            "└ ━│ d         next device                              │──┘",
            "┌ L│ Tab       next process (then all)                  │──┐",
            "│  │ ↑ ↓, k j  select an allocation                     │e │",
            "│▶ │ Enter     show its full stack                      │gh│",
            "│  │ t         table: largest / lines / model / tensors │_k│",
            "│  │ /         filter by label (Esc clears)             │d │",
            "└──│ ?, h      this help                                │──┘",
            "┌ L│ Esc       close / clear the filter                 │──┐",
            "│██│ q         quit                                     │▒▒│",
            "└──└────────────────────────────────────────────────────┘──┘",
            " FOLLOW  t=10.00 s step 1.00 s t:largest  ? help  q quit │ /",
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
            " FOLLOW  t=10.00 s step 1.00 s t:largest  ? help  q quit │ /",
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
            " FOLLOW  t=0.00 s step 1.00 s t:largest  ? help  q quit     ",
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

/// The H200's bug: after the traced process exited NVML listed none of it (used 0 B) and the
/// panel said "untraced −1.05 GiB". Now the header says exited and NVML's panel has no figure.
#[test]
fn an_exited_process_has_no_untraced_figure() {
    let mut app = app();
    app.apply([
        Update::Exited { pid: 4242 },
        Update::Exited { pid: 4243 },
        Update::Nvml {
            device: 0,
            panel: NvmlPanel::Available {
                used_bytes: 0,
                total_bytes: 140 * GIB,
                processes: Vec::new(),
            },
        },
    ]);
    assert_lines(
        render(25, 9, |area, buf| nvml::render(&app, area, buf)),
        &[
            "┌ NVML ─────────────────┐",
            "│used              0 B  │",
            "│total      140.00 GiB  │",
            "│traced      12.00 GiB  │",
            "│untraced: no figure,   │",
            "│the traced process     │",
            "│exited                 │",
            "│                       │",
            "└───────────────────────┘",
        ],
    );
    assert_lines(
        render(100, 1, |area, buf| header::render(&app, area, buf)),
        &[
            "Processes  all · 4242 vllm serve Qwen/Qwen3.6-27B (exited) · 4243 worker (exited)                   ",
        ],
    );
}

/// One process still running but missing from NVML's list (another container's pid
/// namespace, or NVML lagging): no figure either, and why.
#[test]
fn nvml_without_the_traced_process_has_no_untraced_figure() {
    let mut app = app();
    app.apply([Update::Nvml {
        device: 0,
        panel: NvmlPanel::Available {
            used_bytes: 8 * GIB,
            total_bytes: 140 * GIB,
            processes: vec![NvmlProcess {
                pid: 77,
                used_bytes: 8 * GIB,
            }],
        },
    }]);
    assert_lines(
        render(25, 9, |area, buf| nvml::render(&app, area, buf)),
        &[
            "┌ NVML ─────────────────┐",
            "│used         8.00 GiB  │",
            "│total      140.00 GiB  │",
            "│traced      12.00 GiB  │",
            "│untraced: no figure,   │",
            "│NVML does not list the │",
            "│traced process         │",
            "│pid 77       8.00 GiB  │",
            "└───────────────────────┘",
        ],
    );
}

fn tensor_snapshot() -> LiveSnapshot {
    let tensor = |size_bytes: u64, name: &str, top: &str| LiveAllocation {
        size_bytes,
        name: name.into(),
        driver_function: "tensor, activations".into(),
        age_s: 0.5,
        top_frame: top.into(),
        stack: vec![top.into()],
    };
    LiveSnapshot {
        time_s: 10.0,
        largest: vec![
            tensor(256 * MIB, "", "driver.py:761 get_empty_cache_for_benchmark"),
            tensor(
                97 * MIB + 512 * MIB / 1024,
                "empty [1, 4128, 48, 128] bf16",
                "chunk_delta_h.py:722 chunk_gated_delta_rule_fwd_h",
            ),
        ],
        breakdown: vec![
            BreakdownEntry {
                label: "activations".into(),
                bytes: 334_436_352,
            },
            BreakdownEntry {
                label: "autotuning".into(),
                bytes: 256 * MIB,
            },
            BreakdownEntry {
                label: "allocator reserve".into(),
                bytes: 260_359_168,
            },
        ],
        by_line: vec![
            LineGroup {
                line: "driver.py:761 get_empty_cache_for_benchmark".into(),
                count: 1,
                bytes: 256 * MIB,
            },
            LineGroup {
                line: "wy_fast.py:273 recompute_w_u_fwd".into(),
                count: 2,
                bytes: 97 * MIB,
            },
        ],
        model: None,
        growth: Some(crate::model::GrowthPanel {
            verdict: "leak".into(),
            headline: "leak: app.py:12 keep grows 8.00 MiB/h".into(),
            lines: vec![crate::model::GrowthRow {
                place: "app.py:12 keep".into(),
                bytes_per_hour: 8.0 * MIB as f64,
                uncertainty_bytes_per_hour: 0.5 * MIB as f64,
                live_bytes: 64 * MIB,
                verdict: "leak".into(),
            }],
        }),
    }
}

/// The tensors grouped by Python line, the `t` key's first table.
#[test]
fn tensors_by_python_line() {
    let mut app = app();
    app.set_snapshot(Some(tensor_snapshot()));
    key(&mut app, KeyCode::Char('t'));
    assert_eq!(app.table(), crate::tui::Table::ByLine);
    assert_lines(
        render(70, 5, |area, buf| tables::render_by_line(&app, area, buf)),
        &[
            "┌ Live tensors by Python line at 10.00 s ────────────────────────────┐",
            "│Bytes      Tensors  Python line                                     │",
            "│ 256.0 MiB        1 driver.py:761 get_empty_cache_for_benchmark     │",
            "│  97.0 MiB        2 wy_fast.py:273 recompute_w_u_fwd                │",
            "└────────────────────────────────────────────────────────────────────┘",
        ],
    );
    // Without a model the key goes on to the growth table, then back to the largest-live one.
    key(&mut app, KeyCode::Char('t'));
    assert_eq!(app.table(), crate::tui::Table::Growth);
    assert_lines(
        render(70, 4, |area, buf| tables::render_growth(&app, area, buf)),
        &[
            "┌ Growth so far: leak: app.py:12 keep grows 8.00 MiB/h ──────────────┐",
            "│Rate           ±             Live       Verdict  Where              │",
            "│    +8.0 MiB/h   ± 512.0 KiB   64.0 MiB leak     app.py:12 keep     │",
            "└────────────────────────────────────────────────────────────────────┘",
        ],
    );
    key(&mut app, KeyCode::Char('t'));
    assert_eq!(app.table(), crate::tui::Table::Largest);
    // A trace with no tensor records says so.
    app.set_snapshot(Some(LiveSnapshot::default()));
    key(&mut app, KeyCode::Char('t'));
    assert_lines(
        render(70, 3, |area, buf| tables::render_by_line(&app, area, buf)),
        &[
            "┌ Live tensors by Python line at 10.00 s ────────────────────────────┐",
            "│   no tensor records: the trace has only the driver's allocations   │",
            "└────────────────────────────────────────────────────────────────────┘",
        ],
    );
}

/// The tensor rows of the largest-live table: the Python line as the top frame, the category
/// beside the word tensor.
#[test]
fn largest_live_tensors() {
    let mut app = app();
    app.set_snapshot(Some(tensor_snapshot()));
    assert_lines(
        render(110, 5, |area, buf| largest::render(&app, area, buf)),
        &[
            "┌ Largest live at 10.00 s (cuda:0, all processes) ───────────────────────────────────────────────────────────┐",
            "│  Size       Name                  Function            Age       Top frame                                  │",
            "│▶  256.0 MiB unnamed               tensor, activations  500.0 ms driver.py:761 get_empty_cache_for_benchmark│",
            "│    97.5 MiB empty [1, 4128, 48, 1 tensor, activations  500.0 ms chunk_delta_h.py:722 chunk_gated_delta_rule│",
            "└────────────────────────────────────────────────────────────────────────────────────────────────────────────┘",
        ],
    );
}

fn forecast(context: u64, next: u64, largest: Option<u64>) -> Forecast {
    Forecast {
        context_tokens: context,
        kv_bytes_per_token: 32 * 1024,
        chunk_tokens: 4128,
        next_step_bytes: next,
        limit_bytes: 24 * GIB,
        limit_label: "--capacity".into(),
        largest_context: largest,
        capped: false,
        kv_pool_tokens: None,
        limited_by_pool: false,
    }
}

/// The forecast line and the model table of `--model`.
#[test]
fn forecast_line_and_model_table() {
    let mut app = app();
    let mut snap = tensor_snapshot();
    snap.model = Some(ModelAtCursor {
        title: "Qwen3-0.6B (transformers), chunk 4128, KV block 16".into(),
        parts: vec![
            ModelPart {
                category: "weights".into(),
                modelled_bytes: Some(1_812_082_688),
                observed_bytes: 1_812_091_904,
                rests_on: "config: parameters and their format".into(),
            },
            ModelPart {
                category: "engine buffers".into(),
                modelled_bytes: Some(40 * GIB),
                observed_bytes: 40 * GIB,
                rests_on: "the trace, given as it stands".into(),
            },
            ModelPart {
                category: "unnamed".into(),
                modelled_bytes: None,
                observed_bytes: MIB,
                rests_on: "never modelled".into(),
            },
        ],
        forecast: Ok(forecast(12_288, 22 * GIB, Some(20_188))),
        tensors: Err("no live set read".into()),
    });
    app.set_snapshot(Some(snap));
    assert_lines(
        render(140, 1, |area, buf| tables::render_forecast(&app, area, buf)),
        &[
            " Forecast context 12,288 tok · next chunk (4,128 tok) 22.00 GiB of 24.00 GiB --capacity · headroom 2.00 GiB · cliff in 7,900 tok (at 20,188)",
        ],
    );
    key(&mut app, KeyCode::Char('t'));
    key(&mut app, KeyCode::Char('t'));
    assert_eq!(app.table(), crate::tui::Table::Model);
    assert_lines(
        render(100, 6, |area, buf| tables::render_model(&app, area, buf)),
        &[
            "┌ Qwen3-0.6B (transformers), chunk 4128, KV block 16 at 10.00 s ───────────────────────────────────┐",
            "│Category             Modelled    Observed    Differs     Rests on                                 │",
            "│weights                 1.69 GiB    1.69 GiB    +9.0 KiB config: parameters and their format      │",
            "│engine buffers         40.00 GiB   40.00 GiB         0 B the trace, given as it stands            │",
            "│unnamed                        –     1.0 MiB           – never modelled                           │",
            "└──────────────────────────────────────────────────────────────────────────────────────────────────┘",
        ],
    );
    assert_eq!(
        forecast_text(&forecast(40_000, 25 * GIB, None)),
        "context 40,000 tok · next chunk (4,128 tok) 25.00 GiB of 24.00 GiB --capacity · short by 1.00 GiB: the next chunk is modelled not to fit"
    );
    assert_eq!(
        forecast_text(&Forecast {
            capped: true,
            ..forecast(0, GIB, Some(1 << 24))
        }),
        "context 0 tok · next chunk (4,128 tok) 1.00 GiB of 24.00 GiB --capacity · headroom 23.00 GiB · no cliff up to 16,777,216 tok"
    );
    // A preallocated KV pool: no context to read, the chunk at its smallest step, and what
    // stops the context, the pool or memory.
    let pool = |largest, by_pool| Forecast {
        kv_pool_tokens: Some(600_000),
        limited_by_pool: by_pool,
        ..forecast(0, 20 * GIB, largest)
    };
    assert_eq!(
        forecast_text(&pool(Some(600_000), true)),
        "KV pool 600,000 tok preallocated · a chunk (4,128 tok) 20.00 GiB of 24.00 GiB --capacity · headroom 4.00 GiB · context bounded by the pool (600,000 tok)"
    );
    assert_eq!(
        forecast_text(&pool(Some(90_000), false)),
        "KV pool 600,000 tok preallocated · a chunk (4,128 tok) 20.00 GiB of 24.00 GiB --capacity · headroom 4.00 GiB · memory holds a context up to 90,000 tok"
    );
}

/// The model's tensors beside the live allocations (the `t` key's fourth table): matched rows
/// with their line and basis, an unmatched one dimmed with the line the model cites, the
/// footer's matched share; `p` and `n` move the cursor and the table keeps its place.
#[test]
fn model_tensors_table() {
    let mut app = app();
    let mut snap = tensor_snapshot();
    let row =
        |name: &str, bytes: u64, observed: Option<u64>, line: &str, basis: &str| ModelTensor {
            name: name.into(),
            modelled_bytes: bytes,
            observed_bytes: observed,
            line: line.into(),
            basis: basis.into(),
        };
    snap.model = Some(ModelAtCursor {
        title: "Qwen3.5 (transformers), chunk 16384, KV block 1".into(),
        parts: Vec::new(),
        forecast: Err("no limit".into()),
        tensors: Ok(ModelTensors {
            title: "gdn layer's peak, chunk 16,384 at context 16,384".into(),
            rows: vec![
                row(
                    "h",
                    256 * MIB,
                    Some(256 * MIB),
                    "chunk_delta_h.py:722 chunk_gated_delta_rule_fwd_h",
                    "frame at its line",
                ),
                row(
                    "z",
                    128 * MIB,
                    Some(128 * MIB),
                    "modeling_qwen3_5.py:568 forward",
                    "frame in its file",
                ),
                row(
                    "o",
                    128 * MIB,
                    None,
                    "model: fla/ops/common/chunk_o.py:565",
                    "unmatched",
                ),
            ],
            live_count: 153,
            live_bytes: 3_629_720_064,
        }),
    });
    app.set_snapshot(Some(snap.clone()));
    for _ in 0..3 {
        key(&mut app, KeyCode::Char('t'));
    }
    assert_eq!(app.table(), crate::tui::Table::Tensors);
    assert_eq!(
        tables::tensors_footer(snap.model.as_ref().unwrap().tensors.as_ref().unwrap()),
        "matched 384.0 MiB of 512.0 MiB modelled (2 of 3 tensors) · live 153 allocations, 3.38 GiB"
    );
    key(&mut app, KeyCode::Down);
    assert_eq!(app.selected_row(), 1);
    let expected = [
        "┌ Model tensors: gdn layer's peak, chunk 16,384 at context 16,384 at 10.00 s ─────────────────────────────────────┐",
        "│Tensor               Modelled   Observed   Line                                               Matched by         │",
        "│h                     256.0 MiB  256.0 MiB chunk_delta_h.py:722 chunk_gated_delta_rule_fwd_h  frame at its line  │",
        "│z                     128.0 MiB  128.0 MiB modeling_qwen3_5.py:568 forward                    frame in its file  │",
        "│o                     128.0 MiB          – model: fla/ops/common/chunk_o.py:565               unmatched          │",
        "│matched 384.0 MiB of 512.0 MiB modelled (2 of 3 tensors) · live 153 allocations, 3.38 GiB                        │",
        "└─────────────────────────────────────────────────────────────────────────────────────────────────────────────────┘",
    ];
    assert_lines(
        render(115, 7, |area, buf| tables::render_tensors(&app, area, buf)),
        &expected,
    );
    // `p` and `n` move the cursor; the table stays, and shows the snapshot the source gives
    // for the new cursor.
    key(&mut app, KeyCode::Char('p'));
    assert_eq!(app.cursor_time(), 8.0);
    assert_eq!(app.table(), crate::tui::Table::Tensors);
    assert_eq!(app.snapshot_query().unwrap().time_s, 8.0);
    key(&mut app, KeyCode::Char('n'));
    assert_eq!(app.cursor_time(), 9.0);
    assert_eq!(app.table(), crate::tui::Table::Tensors);
    // A step that could not be modelled says why; the key goes back to the largest table.
    if let Some(m) = snap.model.as_mut() {
        m.tensors = Err("not modelled: the context is past the model's window".into());
    }
    app.set_snapshot(Some(snap));
    assert_lines(
        render(70, 3, |area, buf| tables::render_tensors(&app, area, buf)),
        &[
            "┌ Model tensors ─────────────────────────────────────────────────────┐",
            "│        not modelled: the context is past the model's window        │",
            "└────────────────────────────────────────────────────────────────────┘",
        ],
    );
    key(&mut app, KeyCode::Char('t'));
    assert_eq!(app.table(), crate::tui::Table::Growth);
    key(&mut app, KeyCode::Char('t'));
    assert_eq!(app.table(), crate::tui::Table::Largest);
}

/// With segments cached the live bytes stand still while the tensors in them come and go: the
/// bytes in use are drawn under the live line, the reserve the gap between them.
#[test]
fn the_reserve_band_under_the_live_line() {
    let mut app = App::new(ViewOptions::default());
    app.apply([Update::Categories {
        device: 0,
        names: vec!["activations".into(), "allocator reserve".into()],
    }]);
    let points = [
        (0.0, 0, 0),
        (1.0, 2, 6),
        (2.0, 6, 2),
        (3.0, 1, 7),
        (4.0, 8, 0),
    ];
    app.apply(points.iter().map(|&(t, used, reserve)| Update::Sample {
        device: 0,
        point: TimelinePoint::stacked(t, vec![used * GIB, reserve * GIB]),
    }));
    assert_lines(
        render(60, 10, |area, buf| chart::render(&app, area, buf)),
        &[
            "┌ Live bytes, cuda:0 ──────────────────────────────────────┐",
            "│10 GiB│                                                   │",
            "│      │           ⡠⠔•⠒⠒⠒⠒⠒⠒⠒⠒⠒⠒⠒⠒⠒⠒⠒⠒⠒⠒⠒⠒⠒⠒⠒⠒⠒⠒⠒⠒⠒⠒⠒⠒⠒⠒⠒⡠⠔│",
            "│      │        ⣀⠔⠊           ⣀⡠⠤⠒⠢⢄⡀                ⢀⡠⠒⠉  │",
            "│5 GiB │     ⢀⠤⠊        ⢀⣀⠤⠔⠊⠉      ⠈⠑⠢⢄⡀         ⢀⡠⠒⠁     │",
            "│      │  ⢀⡠⠒⠁   ⣀⣀⡠⠤⠔⠒⠉⠁               ⠈⠑⠢⢄⡀  ⢀⠤⠒⠁        │",
            "│0     │⣀⡠⠤⠤⠒⠒⠊⠉⠉                           ⠈⠑⠊⠁           │",
            "│      └───────────────────────────────────────────────────│",
            "│ 0.00 s                       2.00 s                4.00 s│",
            "└ ━ live  ━ in use (reserve between)  • peak 8.00 GiB  ────┘",
        ],
    );
}
