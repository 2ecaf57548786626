//! View models of `vramtrace plot`, built from traces and the analytical models; the viewer
//! crate draws them.
//!
//! - [`timeline`]: the trace folded as the live view folds it ([`crate::timeline`]),
//!   stacked by [`crate::categories::CATEGORIES`] (categories never used are left out).
//! - [`breakdown`]: a moment observed as `compare` observes it, against the variant that
//!   explains the most bytes with evidence.
//! - [`cliff`]: the model's peak against prompt tokens as `model --sweep` computes it, plus the
//!   resident bytes, against a capacity, with observed points.

use std::collections::BTreeMap;
use std::path::Path;

use vramtrace_models::units::fmt_bytes;
use vramtrace_models::{ModelConfig, Variant, WorkloadOptions};
use vramtrace_view_model::{
    BreakdownPlot, BreakdownRow, CliffCurve, DEFAULT_MAX_POINTS, DeviceInfo, Timeline,
    TimelinePlot, TimelinePoint, Update,
};

use crate::attribution::Attribution;
use crate::categories::CATEGORIES;
use crate::cliff::{cliff_tokens, peaks_at};
use crate::error::Error;
use crate::observe::{At, ObservedMoment, observe};
use crate::trace::Trace;

/// Refuses a `--hide` that names no category (a title, `KV cache`, or a `report --json` key,
/// `kv_cache`).
pub fn check_hide(hide: &[String]) -> crate::Result<()> {
    for h in hide {
        if crate::categories::parse(h).is_none() {
            return Err(Error::Invalid(format!(
                "--hide {h:?}: the categories are {}",
                CATEGORIES.join(", ")
            )));
        }
    }
    Ok(())
}

/// True when `--hide` names category index `c`.
fn hidden(hide: &[String], c: usize) -> bool {
    hide.iter()
        .any(|h| crate::categories::parse(h).is_some_and(|x| x.index() == c))
}

/// The timeline of every device of `trace` (read from `dir`, which messages name), stacked by
/// category.
pub fn timeline(
    trace: &Trace,
    dir: &Path,
    title: &str,
    capacity: Option<u64>,
    predicted_peak: Option<u64>,
    hide: &[String],
) -> crate::Result<TimelinePlot> {
    check_hide(hide)?;
    let updates = crate::timeline::fold(trace)?;
    let (marks, enforced) = marks_and_limit(trace)?;
    // Without --capacity, the limit the trace says was enforced (PyTorch's memory fraction).
    let (capacity, capacity_label) = match (capacity, enforced) {
        (Some(c), _) => (Some(c), None),
        (None, Some(l)) => (Some(l), Some("enforced limit (PyTorch)".to_string())),
        (None, None) => (None, None),
    };
    let mut infos: BTreeMap<u32, DeviceInfo> = BTreeMap::new();
    let mut points: BTreeMap<u32, Vec<TimelinePoint>> = BTreeMap::new();
    let mut failures = Vec::new();
    for u in updates {
        match u {
            Update::Device(d) => {
                infos.insert(d.ordinal, d);
            }
            Update::Sample { device, point } => points.entry(device).or_default().push(point),
            Update::Failure(f) => failures.push(f),
            _ => {}
        }
    }
    if points.is_empty() {
        return Err(Error::Unanswerable(format!(
            "{} holds no device allocation to plot (its processes made none the recorder saw)",
            dir.display()
        )));
    }
    let mut devices = Vec::new();
    for (ordinal, pts) in points {
        // Only the categories that ever held bytes.
        let used: Vec<usize> = (0..CATEGORIES.len())
            .filter(|&c| !hidden(hide, c))
            .filter(|&c| {
                pts.iter()
                    .any(|p| p.by_category.get(c).is_some_and(|b| *b > 0))
            })
            .collect();
        let mut t = Timeline::new(DEFAULT_MAX_POINTS)
            .with_categories(used.iter().map(|&c| CATEGORIES[c].to_string()).collect())
            .with_capacity_bytes(capacity)
            .with_capacity_label(capacity_label.clone())
            .with_predicted_peak_bytes(predicted_peak)
            .with_marks(marks.clone());
        for p in pts {
            let parts = used
                .iter()
                .map(|&c| p.by_category.get(c).copied().unwrap_or(0));
            t.push(TimelinePoint::stacked(p.time_s, parts.collect()));
        }
        for f in failures.iter().filter(|f| f.device == ordinal) {
            t.push_failure(f.clone());
        }
        let info = infos.remove(&ordinal).unwrap_or(DeviceInfo {
            ordinal,
            name: format!("cuda:{ordinal}"),
            total_bytes: 0,
        });
        devices.push((info, t));
    }
    Ok(TimelinePlot {
        title: title.to_string(),
        devices,
    })
}

/// The growth plot of `growth` ([`crate::growth`]): its categories stacked, the bytes held, and
/// the steady state's line fitted to the bytes held (`title` or the trace's name).
pub fn growth(g: &crate::growth::Growth, title: &str) -> vramtrace_view_model::GrowthPlot {
    use crate::categoriser::Category;
    let categories = g
        .series
        .by_category
        .iter()
        .filter_map(|(key, v)| {
            let c = Category::ALL.iter().find(|c| c.key() == *key)?;
            Some((c.title().to_string(), c.index(), v.clone()))
        })
        .collect();
    let points = g
        .series
        .t_s
        .iter()
        .zip(&g.series.held)
        .filter(|(t, _)| **t >= g.steady_from_s)
        .map(|(t, b)| (*t, *b as f64));
    let steady = crate::growth::fit::line(points).map(|f| {
        let end = g.series.t_s.last().copied().unwrap_or(g.steady_from_s);
        let at = |t: f64| (t, (f.intercept + f.slope * t).max(0.0));
        (at(g.steady_from_s), at(end))
    });
    let sign = if g.rate_bytes_per_hour < 0.0 {
        "−"
    } else {
        "+"
    };
    vramtrace_view_model::GrowthPlot {
        title: format!("{title}: growth over the run ({})", g.verdict.key()),
        subtitle: g.evidence.first().cloned().unwrap_or_default(),
        t_s: g.series.t_s.clone(),
        categories,
        held: g.series.held.clone(),
        steady,
        steady_label: format!(
            "steady state from {:.1} s: {sign}{}/h",
            g.steady_from_s,
            fmt_bytes(g.rate_bytes_per_hour.abs().round() as u64)
        ),
    }
}

/// The tensors live at the highest tensor peak of `trace` (the process and device whose
/// PyTorch tensors peaked highest) grouped by Python line, most bytes first, at most `top`
/// lines (the rest in one row); `None` when the trace has no tensor records.
pub fn lines(trace: &Trace, title: Option<&str>, top: usize) -> crate::Result<BreakdownPlot> {
    let s = crate::summary::summarize(
        trace,
        crate::summary::SummaryOptions {
            top: usize::MAX,
            frames: 0,
        },
    )?;
    let best = s
        .processes
        .iter()
        .flat_map(|p| p.devices.iter().map(move |d| (p, d)))
        .filter_map(|(p, d)| Some((p, d, d.tensors.as_ref()?)))
        .max_by_key(|(_, _, t)| t.peak_bytes);
    let Some((p, d, t)) = best else {
        return Err(Error::Unanswerable(
            "the trace has no tensor records (PyTorch's tensors were not recorded): `plot --kind timeline` draws the driver's allocations".into(),
        ));
    };
    let mut by_line: BTreeMap<String, (u64, usize)> = BTreeMap::new();
    for x in t.at_peak.iter().flat_map(|m| &m.tensors) {
        let e = by_line
            .entry(x.line.clone().unwrap_or_else(|| "(no Python frame)".into()))
            .or_default();
        e.0 += x.size;
        e.1 += 1;
    }
    let mut v: Vec<(String, (u64, usize))> = by_line.into_iter().collect();
    v.sort_by(|a, b| b.1.0.cmp(&a.1.0).then(a.0.cmp(&b.0)));
    let rest: Vec<(String, (u64, usize))> = v.split_off(top.min(v.len()));
    let mut rows: Vec<BreakdownRow> = v
        .into_iter()
        .map(|(line, (bytes, n))| BreakdownRow {
            tensor: format!("{line} ×{n}"),
            predicted_bytes: None,
            observed_bytes: Some(bytes),
        })
        .collect();
    if !rest.is_empty() {
        rows.push(BreakdownRow {
            tensor: format!("{} more lines", rest.len()),
            predicted_bytes: None,
            observed_bytes: Some(rest.iter().map(|r| r.1.0).sum()),
        });
    }
    Ok(BreakdownPlot {
        title: title.map(str::to_string).unwrap_or_else(|| {
            format!(
                "pid {} cuda:{}: {} of tensors at their peak ({:.3} s), by Python line",
                p.pid,
                d.device,
                fmt_bytes(t.peak_bytes),
                t.peak_t_s
            )
        }),
        rows,
    })
}

/// A mark on the time axis: seconds since the trace began, and its name.
pub type Mark = (f64, String);

/// Where each chunk begins, from the trace's range labels (`prefill/chunk.3/…`: the first
/// range of each chunk, as `chunk 3`, in seconds since the trace began), and the limit PyTorch's
/// caching allocator enforced (`set_per_process_memory_fraction`: the tensor records' `limit`,
/// when one was set below the device).
pub fn marks_and_limit(trace: &Trace) -> crate::Result<(Vec<Mark>, Option<u64>)> {
    let t0 = trace.start_ns();
    let mut seen = std::collections::BTreeSet::new();
    let mut marks = Vec::new();
    let mut limit: Option<u64> = None;
    for (pi, it) in trace.items()? {
        match &it {
            crate::trace::Item::RangePush { t_ns, name, .. } => {
                let Some(n) = trace.processes[pi]
                    .string(*name)
                    .and_then(crate::report::step::chunk_of_label)
                else {
                    continue;
                };
                if seen.insert(n) {
                    marks.push((t_ns.saturating_sub(t0) as f64 / 1e9, format!("chunk {n}")));
                }
            }
            crate::trace::Item::Tensor(te) if te.limit > 0 => {
                let total = trace.processes[pi]
                    .devices
                    .iter()
                    .find(|d| d.ordinal == te.device)
                    .map(|d| d.total_bytes);
                if total.is_none_or(|t| te.limit < t) {
                    limit = Some(limit.map_or(te.limit, |l| l.min(te.limit)));
                }
            }
            _ => {}
        }
    }
    Ok((marks, limit))
}

/// Observed beside predicted bytes per tensor at a moment.
pub fn breakdown(
    model_name: &str,
    at: &str,
    variant: Variant,
    m: &ObservedMoment,
    a: &Attribution,
) -> BreakdownPlot {
    let rows: Vec<BreakdownRow> = a
        .rows
        .iter()
        .map(|r| {
            let failed = a.failed_tensor == Some(r.tensor);
            BreakdownRow {
                tensor: if failed {
                    format!("{} (failed request)", r.name)
                } else {
                    r.name.clone()
                },
                predicted_bytes: Some(r.predicted_bytes),
                observed_bytes: r.observed.map(|i| a.observed[i].size),
            }
        })
        .collect();
    // What the model does not name is left out (its bytes would dwarf the tensors); the
    // title says how much.
    let rest: u64 = a
        .unexplained
        .iter()
        .map(|&i| &a.observed[i])
        .filter(|o| !o.failed)
        .map(|o| o.size)
        .sum();
    BreakdownPlot {
        title: format!(
            "{} on {model_name} at {at} ({:.3} s), pid {}, cuda:{}; {} live not in the model",
            variant.name(),
            m.t_s,
            m.pid,
            m.device,
            fmt_bytes(rest)
        ),
        rows,
    }
}

/// The cliff curve: `resident` plus the largest variant peak at each token count of the sweep.
#[allow(clippy::too_many_arguments)]
pub fn cliff(
    title: &str,
    cfg: &ModelConfig,
    variants: &[Variant],
    opts: &WorkloadOptions,
    range: Option<(u64, u64)>,
    capacity: u64,
    resident: u64,
    observed: Vec<(u64, u64)>,
) -> crate::Result<CliffCurve> {
    let budget = capacity.checked_sub(resident).ok_or_else(|| {
        Error::Unanswerable(format!(
            "the resident bytes ({}) already exceed the capacity ({}); nothing fits",
            fmt_bytes(resident),
            fmt_bytes(capacity)
        ))
    })?;
    let cliff_at = cliff_tokens(cfg, variants, opts, budget)?;
    let (t0, t1) = match range {
        Some(r) => r,
        None => {
            let far = observed.iter().map(|o| o.0).max().unwrap_or(0);
            let end = cliff_at
                .unwrap_or(65_536)
                .max(far)
                .saturating_mul(2)
                .max(64);
            (64.min(end), end)
        }
    };
    let step = ((t1 - t0) / 128).max(1);
    let mut model = Vec::new();
    let mut t = t0;
    loop {
        let p = peaks_at(cfg, variants, opts, t)?
            .into_iter()
            .max()
            .unwrap_or(0);
        model.push((t, resident.saturating_add(p)));
        if t >= t1 {
            break;
        }
        t = (t + step).min(t1);
    }
    if let Some(c) = cliff_at
        && (t0..=t1).contains(&c)
    {
        let p = peaks_at(cfg, variants, opts, c)?
            .into_iter()
            .max()
            .unwrap_or(0);
        model.push((c, resident.saturating_add(p)));
        model.sort_by_key(|m| m.0);
        model.dedup_by_key(|m| m.0);
    }
    Ok(CliffCurve {
        title: title.to_string(),
        model,
        capacity_bytes: Some(capacity),
        cliff_tokens: cliff_at,
        observed,
    })
}

/// Observes the moment `at` of a trace (as `compare --at`).
pub fn observe_at(
    trace: &Trace,
    pid: Option<u32>,
    device: Option<i32>,
    at: At,
) -> crate::Result<ObservedMoment> {
    observe(trace, pid, device, at)
}
