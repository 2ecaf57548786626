//! A device's live-bytes timeline with a bounded number of points.

use crate::model::{DeviceInfo, FailedAllocation, Peak, TimelinePoint};

/// Points a timeline keeps by default before it thins older ones.
pub const DEFAULT_MAX_POINTS: usize = 4096;

/// Failures a timeline keeps exactly; later ones are only counted.
pub const MAX_KEPT_FAILURES: usize = 1024;

/// The category whose bytes are PyTorch's segments' reserve: held, not in use.
pub const RESERVE_CATEGORY: &str = "allocator reserve";

/// Live bytes of one device over time, with its peak, its failures and the
/// lines drawn across it (capacity, predicted peak).
///
/// Memory stays bounded however long the trace runs: once more than
/// `max_points` points are held, the older half is thinned by keeping the
/// lowest and the highest point of every four, so the envelope of the curve
/// survives while older history gets coarser. The peak is tracked exactly on
/// the side and (being the highest point of its group) is never thinned away.
/// Failures are kept exactly up to [`MAX_KEPT_FAILURES`], and counted beyond.
#[derive(Debug, Clone, PartialEq)]
pub struct Timeline {
    categories: Vec<String>,
    points: Vec<TimelinePoint>,
    max_points: usize,
    peak: Option<Peak>,
    in_use_peak: Option<Peak>,
    held_reserve: bool,
    failures: Vec<FailedAllocation>,
    failures_total: u64,
    capacity_bytes: Option<u64>,
    capacity_label: Option<String>,
    predicted_peak_bytes: Option<u64>,
    marks: Vec<(f64, String)>,
}

impl Default for Timeline {
    fn default() -> Self {
        Self::new(DEFAULT_MAX_POINTS)
    }
}

impl Timeline {
    /// An empty timeline keeping at most `max_points` points (at least 8).
    pub fn new(max_points: usize) -> Self {
        Self {
            categories: Vec::new(),
            points: Vec::new(),
            max_points: max_points.max(8),
            peak: None,
            in_use_peak: None,
            held_reserve: false,
            failures: Vec::new(),
            failures_total: 0,
            capacity_bytes: None,
            capacity_label: None,
            predicted_peak_bytes: None,
            marks: Vec::new(),
        }
    }

    /// Names the categories of stacked points ([`TimelinePoint::by_category`]).
    pub fn with_categories(mut self, names: Vec<String>) -> Self {
        self.categories = names;
        self
    }

    /// Draws a capacity line (e.g. `--capacity 24GiB`).
    pub fn with_capacity_bytes(mut self, bytes: Option<u64>) -> Self {
        self.capacity_bytes = bytes;
        self
    }

    /// Names the capacity line (`PyTorch's memory fraction`); without a name it is the
    /// capacity.
    pub fn with_capacity_label(mut self, label: Option<String>) -> Self {
        self.capacity_label = label;
        self
    }

    /// Marks on the time axis (`chunk 3` where the trace's labels say a chunk began), in time
    /// order.
    pub fn with_marks(mut self, marks: Vec<(f64, String)>) -> Self {
        self.marks = marks;
        self
    }

    /// Draws the analytical model's predicted peak.
    pub fn with_predicted_peak_bytes(mut self, bytes: Option<u64>) -> Self {
        self.predicted_peak_bytes = bytes;
        self
    }

    /// Replaces the category names.
    pub fn set_categories(&mut self, names: Vec<String>) {
        self.categories = names;
    }

    /// Sets or clears the capacity line.
    pub fn set_capacity_bytes(&mut self, bytes: Option<u64>) {
        self.capacity_bytes = bytes;
    }

    /// Appends a point. Points are expected in time order; one that goes back
    /// in time is moved to the latest time so the series stays sorted.
    pub fn push(&mut self, mut point: TimelinePoint) {
        if let Some(last) = self.points.last()
            && point.time_s < last.time_s
        {
            point.time_s = last.time_s;
        }
        if self.peak.is_none_or(|p| point.live_bytes > p.bytes) {
            self.peak = Some(Peak {
                time_s: point.time_s,
                bytes: point.live_bytes,
            });
        }
        let held = self
            .categories
            .iter()
            .position(|c| c == RESERVE_CATEGORY)
            .and_then(|r| point.by_category.get(r).copied())
            .unwrap_or(0);
        let in_use = point.live_bytes.saturating_sub(held);
        self.held_reserve |= held > 0;
        if self.in_use_peak.is_none_or(|p| in_use > p.bytes) {
            self.in_use_peak = Some(Peak {
                time_s: point.time_s,
                bytes: in_use,
            });
        }
        self.points.push(point);
        if self.points.len() > self.max_points {
            self.thin_older_half();
        }
    }

    /// Records a failed allocation (kept in time order of arrival).
    pub fn push_failure(&mut self, failure: FailedAllocation) {
        self.failures_total += 1;
        if self.failures.len() < MAX_KEPT_FAILURES {
            self.failures.push(failure);
        }
    }

    fn thin_older_half(&mut self) {
        let older = (self.points.len() / 2) / 4 * 4;
        let mut kept = Vec::with_capacity(self.points.len() - older / 2);
        for group in self.points[..older].chunks(4) {
            let (lo, hi) = extremes(group);
            kept.push(group[lo.min(hi)].clone());
            if lo != hi {
                kept.push(group[lo.max(hi)].clone());
            }
        }
        kept.extend(self.points.drain(older..));
        self.points = kept;
    }

    /// The points held now, in time order.
    pub fn points(&self) -> &[TimelinePoint] {
        &self.points
    }

    /// Category names of stacked points; empty when not stacked.
    pub fn categories(&self) -> &[String] {
        &self.categories
    }

    /// The most points held before thinning.
    pub fn max_points(&self) -> usize {
        self.max_points
    }

    /// The highest live bytes seen, exact (never thinned).
    pub fn peak(&self) -> Option<Peak> {
        self.peak
    }

    /// The highest bytes in use (live bytes less the allocator's reserve), exact; `None` while
    /// no point has held a reserve. With PyTorch's segments cached the live bytes stand still
    /// while the tensors in them come and go: this is the tensors' peak inside that plateau.
    pub fn in_use_peak(&self) -> Option<Peak> {
        self.in_use_peak.filter(|_| self.held_reserve)
    }

    /// The failures kept (the first [`MAX_KEPT_FAILURES`]).
    pub fn failures(&self) -> &[FailedAllocation] {
        &self.failures
    }

    /// How many failures were pushed, kept or not.
    pub fn failures_total(&self) -> u64 {
        self.failures_total
    }

    /// The capacity line, if any.
    pub fn capacity_bytes(&self) -> Option<u64> {
        self.capacity_bytes
    }

    /// The capacity line's name, if one was given.
    pub fn capacity_label(&self) -> Option<&str> {
        self.capacity_label.as_deref()
    }

    /// The marks on the time axis.
    pub fn marks(&self) -> &[(f64, String)] {
        &self.marks
    }

    /// The predicted peak line, if any.
    pub fn predicted_peak_bytes(&self) -> Option<u64> {
        self.predicted_peak_bytes
    }

    /// First and last time held, if any point is.
    pub fn time_range(&self) -> Option<(f64, f64)> {
        Some((self.points.first()?.time_s, self.points.last()?.time_s))
    }

    /// Live bytes at `time_s`: the last point at or before it.
    pub fn live_at(&self, time_s: f64) -> Option<u64> {
        let after = self.points.partition_point(|p| p.time_s <= time_s);
        after.checked_sub(1).map(|i| self.points[i].live_bytes)
    }
}

/// Indices of the lowest and the highest point (first of equals).
fn extremes(group: &[TimelinePoint]) -> (usize, usize) {
    let mut lo = 0;
    let mut hi = 0;
    for (i, p) in group.iter().enumerate() {
        if p.live_bytes < group[lo].live_bytes {
            lo = i;
        }
        if p.live_bytes > group[hi].live_bytes {
            hi = i;
        }
    }
    (lo, hi)
}

/// The timeline plot: one panel per device.
#[derive(Debug, Clone, PartialEq)]
pub struct TimelinePlot {
    /// Title above all panels.
    pub title: String,
    /// Devices with their timelines, one panel each.
    pub devices: Vec<(DeviceInfo, Timeline)>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn failure(time_s: f64) -> FailedAllocation {
        FailedAllocation {
            time_s,
            device: 0,
            pid: 1,
            request_bytes: 1 << 30,
            free_bytes: Some(1 << 20),
            label: "o".into(),
            error: "CUDA_ERROR_OUT_OF_MEMORY".into(),
        }
    }

    /// Cached segments hold the live bytes flat from 1 s; the tensors in them peak at 3 s.
    #[test]
    fn the_peak_of_bytes_in_use_inside_a_plateau_of_segments() {
        let mut t =
            Timeline::new(64).with_categories(vec!["activations".into(), RESERVE_CATEGORY.into()]);
        assert_eq!(t.in_use_peak(), None);
        for (time_s, used, held) in [
            (0.0, 0, 0),
            (1.0, 2, 8),
            (2.0, 5, 5),
            (3.0, 9, 1),
            (4.0, 1, 9),
        ] {
            t.push(TimelinePoint::stacked(time_s, vec![used, held]));
        }
        assert_eq!(
            t.peak(),
            Some(Peak {
                time_s: 1.0,
                bytes: 10
            })
        );
        assert_eq!(
            t.in_use_peak(),
            Some(Peak {
                time_s: 3.0,
                bytes: 9
            })
        );
        // Without a reserve there is no separate peak of bytes in use.
        let mut plain = Timeline::new(64);
        plain.push(TimelinePoint::new(0.0, 7));
        assert_eq!(plain.in_use_peak(), None);
    }

    #[test]
    fn points_stay_bounded_and_peak_and_failures_stay_exact() {
        let mut t = Timeline::new(64);
        // A saw-tooth with one spike far in the past.
        for i in 0..100_000u64 {
            let bytes = if i == 1234 { 999_999 } else { (i % 97) * 10 };
            t.push(TimelinePoint::new(i as f64 * 0.001, bytes));
            if i % 10_000 == 0 {
                t.push_failure(failure(i as f64 * 0.001));
            }
        }
        assert!(t.points().len() <= 64, "{} points held", t.points().len());
        let peak = t.peak().unwrap();
        assert_eq!(peak.bytes, 999_999);
        assert_eq!(peak.time_s, 1.234);
        // The spike survives thinning as a point of the curve.
        assert!(t.points().iter().any(|p| p.live_bytes == 999_999));
        assert_eq!(t.failures().len(), 10);
        assert_eq!(t.failures()[3].time_s, 30.0);
        // The newest points are kept at full resolution.
        assert_eq!(t.points().last().unwrap().time_s, 99.999);
        assert!(t.points().windows(2).all(|w| w[0].time_s <= w[1].time_s));
        assert_eq!(t.time_range(), Some((0.0, 99.999)));
    }

    #[test]
    fn failures_beyond_the_cap_are_counted() {
        let mut t = Timeline::new(8);
        for i in 0..(MAX_KEPT_FAILURES + 5) {
            t.push_failure(failure(i as f64));
        }
        assert_eq!(t.failures().len(), MAX_KEPT_FAILURES);
        assert_eq!(t.failures_total(), MAX_KEPT_FAILURES as u64 + 5);
    }

    #[test]
    fn live_at_is_the_last_point_at_or_before() {
        let mut t = Timeline::new(8);
        t.push(TimelinePoint::new(1.0, 10));
        t.push(TimelinePoint::new(2.0, 20));
        // Back in time: moved to the latest time.
        t.push(TimelinePoint::new(1.5, 30));
        assert_eq!(t.live_at(0.5), None);
        assert_eq!(t.live_at(1.0), Some(10));
        assert_eq!(t.live_at(1.9), Some(10));
        assert_eq!(t.live_at(2.0), Some(30));
        assert_eq!(t.points()[2].time_s, 2.0);
    }
}
