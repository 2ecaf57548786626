//! Plot inputs shaped like a real prefill: a 24 GiB card, weights loaded,
//! a KV pool, activations climbing chunk by chunk until one chunk fails.

#![allow(dead_code)]

use vramtrace_viewer::Timeline;
use vramtrace_viewer::model::{
    BreakdownPlot, BreakdownRow, CliffCurve, DeviceInfo, FailedAllocation, TimelinePoint,
};
use vramtrace_viewer::plot::TimelinePlot;

pub const MIB: u64 = 1 << 20;
pub const GIB: u64 = 1 << 30;

pub fn timeline_plot() -> TimelinePlot {
    let categories = ["weights", "KV cache", "activations", "unnamed"];
    let mut t0 = Timeline::new(512)
        .with_categories(categories.iter().map(|c| c.to_string()).collect())
        .with_capacity_bytes(Some(24 * GIB))
        .with_predicted_peak_bytes(Some(22 * GIB + 300 * MIB));
    let mut t1 = Timeline::new(512)
        .with_categories(categories.iter().map(|c| c.to_string()).collect())
        .with_capacity_bytes(Some(24 * GIB));
    for i in 0..=200u64 {
        let t = i as f64 * 0.05;
        let weights = (i.min(40) * 14 * GIB) / 40;
        let kv = if i >= 45 { 4 * GIB } else { 0 };
        // Activations climb with each chunk and fall back between chunks.
        let act = if i >= 60 {
            ((i - 60) % 20) * 215 * MIB + (i - 60) * 12 * MIB
        } else {
            0
        };
        let act = if i > 178 { 400 * MIB } else { act };
        t0.push(TimelinePoint::stacked(t, vec![weights, kv, act, 600 * MIB]));
        t1.push(TimelinePoint::stacked(
            t,
            vec![weights, kv, act / 2, 600 * MIB],
        ));
    }
    t0.push_failure(FailedAllocation {
        time_s: 8.95,
        device: 0,
        pid: 4242,
        request_bytes: 6 * GIB,
        free_bytes: Some(GIB + 200 * MIB),
        label: "gdn.h".into(),
        error: "CUDA_ERROR_OUT_OF_MEMORY".into(),
    });
    let h200 = |ordinal| DeviceInfo {
        ordinal,
        name: "NVIDIA H200".into(),
        total_bytes: 143_771 * MIB,
    };
    TimelinePlot {
        title: "Prefill of 4128 tokens under --capacity 24GiB".into(),
        devices: vec![(h200(0), t0), (h200(1), t1)],
    }
}

pub fn breakdown_plot() -> BreakdownPlot {
    let rows = [
        ("g cumsum", Some(792_576), Some(792_576)),
        ("A", Some(25_362_432), Some(25_362_432)),
        ("w", Some(50_724_864), Some(50_724_864)),
        ("u", Some(50_724_864), Some(50_724_864)),
        ("h", Some(102_236_160), Some(102_760_448)),
        ("final_state", Some(3_145_728), None),
        ("v_new", Some(50_724_864), Some(50_724_864)),
        ("o", Some(50_724_864), Some(50_724_864)),
        ("softmax_lse", None, Some(2_097_152)),
    ];
    BreakdownPlot {
        title: "At the failure (8.95 s, cuda:0): observed beside predicted".into(),
        rows: rows
            .into_iter()
            .map(|(tensor, predicted_bytes, observed_bytes)| BreakdownRow {
                tensor: tensor.into(),
                predicted_bytes,
                observed_bytes,
            })
            .collect(),
    }
}

pub fn cliff_curve() -> CliffCurve {
    // A peak growing linearly with the prompt above 14 GiB of weights.
    let peak = |tokens: u64| 14 * GIB + tokens * 2 * MIB + tokens * tokens * 6;
    let capacity = 24 * GIB;
    let model: Vec<(u64, u64)> = (0..=32).map(|i| i * 256).map(|t| (t, peak(t))).collect();
    let cliff = (0..=8192u64).find(|&t| peak(t) > capacity);
    CliffCurve {
        title: "Qwen3.6-27B prefill peak against prompt length".into(),
        model,
        capacity_bytes: Some(capacity),
        cliff_tokens: cliff,
        observed: vec![
            (1024, peak(1024) + 180 * MIB),
            (2048, peak(2048) + 210 * MIB),
            (4128, peak(4128) + 260 * MIB),
        ],
    }
}
