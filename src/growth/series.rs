//! Values over time in a bounded number of buckets: the grid doubles its bucket width whenever
//! the trace outlasts [`MAX_BUCKETS`] buckets, so a series of a day-long trace takes as much
//! memory as one of a minute.

/// The most buckets a grid keeps; past that, pairs merge and the width doubles.
pub const MAX_BUCKETS: usize = 256;
/// The narrowest bucket: 1 ms of trace time.
pub const MIN_WIDTH_NS: u64 = 1_000_000;

/// What a bucket keeps of a series' values in it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Keep {
    /// The lowest value (the low-water mark: what stayed live through the bucket).
    Low,
    /// The value at the bucket's end.
    Last,
    /// The highest value.
    High,
}

/// The time grid every series of one fold shares: time 0 and the bucket width.
#[derive(Clone, Copy, Debug)]
pub struct Grid {
    /// `CLOCK_MONOTONIC` ns of time 0.
    pub t0: u64,
    /// Bucket width in ns (a power of two times [`MIN_WIDTH_NS`]).
    pub width_ns: u64,
    /// The bucket of the latest time seen.
    pub current: usize,
}

impl Grid {
    /// A grid from `t0` at the narrowest width.
    pub fn new(t0: u64) -> Grid {
        Grid {
            t0,
            width_ns: MIN_WIDTH_NS,
            current: 0,
        }
    }

    /// The bucket of `t_ns` at the current width (times before time 0 fall in the first).
    pub fn bucket(&self, t_ns: u64) -> usize {
        (t_ns.saturating_sub(self.t0) / self.width_ns) as usize
    }

    /// Moves the grid to `t_ns`; true when the width doubled (every series must then
    /// [`Series::halve`]). Call until it returns false: one call doubles once.
    pub fn advance(&mut self, t_ns: u64) -> bool {
        let b = self.bucket(t_ns);
        if b >= MAX_BUCKETS {
            self.width_ns *= 2;
            self.current /= 2;
            return true;
        }
        self.current = self.current.max(b);
        false
    }

    /// Buckets in use.
    pub fn len(&self) -> usize {
        self.current + 1
    }

    /// Whether no bucket is in use (never: the first bucket always is).
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Seconds from time 0 to the start of bucket `i`.
    pub fn start_s(&self, i: usize) -> f64 {
        (i as u64 * self.width_ns) as f64 / 1e9
    }
}

/// One value over the grid's buckets: the value now, and one figure per bucket up to the last
/// bucket it changed in (later buckets hold the value now).
#[derive(Clone, Debug, Default)]
pub struct Series {
    /// The value now.
    pub now: u64,
    v: Vec<u64>,
}

impl Series {
    /// Brings the series to bucket `b`: buckets it skipped held the value now.
    fn reach(&mut self, b: usize) {
        while self.v.len() <= b {
            self.v.push(self.now);
        }
    }

    /// The value becomes `to` in bucket `b` (the grid's current bucket).
    pub fn set(&mut self, b: usize, to: u64, keep: Keep) {
        self.reach(b);
        self.now = to;
        let slot = &mut self.v[b];
        *slot = match keep {
            Keep::Low => (*slot).min(to),
            Keep::Last => to,
            Keep::High => (*slot).max(to),
        };
    }

    /// Adds `by` in bucket `b`.
    pub fn add(&mut self, b: usize, by: u64, keep: Keep) {
        let to = self.now.saturating_add(by);
        self.set(b, to, keep);
    }

    /// Takes `by` away in bucket `b`.
    pub fn sub(&mut self, b: usize, by: u64, keep: Keep) {
        let to = self.now.saturating_sub(by);
        self.set(b, to, keep);
    }

    /// Merges bucket pairs after the grid's width doubled.
    pub fn halve(&mut self, keep: Keep) {
        let n = self.v.len();
        let mut out = Vec::with_capacity(n.div_ceil(2));
        for pair in self.v.chunks(2) {
            // A missing second bucket was not reached yet: it holds the value now, which the
            // first bucket's figure already bounds (a low-water is at most it, the last is it).
            let second = pair.get(1).copied();
            out.push(match (keep, second) {
                (_, None) => pair[0],
                (Keep::Low, Some(s)) => pair[0].min(s),
                (Keep::Last, Some(s)) => s,
                (Keep::High, Some(s)) => pair[0].max(s),
            });
        }
        self.v = out;
    }

    /// The figure of every bucket of a grid of `len` buckets.
    pub fn values(&self, len: usize) -> Vec<u64> {
        let mut v: Vec<u64> = self.v.iter().copied().take(len).collect();
        v.resize(len, self.now);
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bucket_keeps_its_low_water_mark_and_skipped_buckets_the_value() {
        let mut s = Series::default();
        s.add(0, 100, Keep::Low);
        s.add(2, 50, Keep::Low);
        s.sub(2, 120, Keep::Low);
        s.add(2, 200, Keep::Low);
        // Bucket 0 began at 0; bucket 1 held 100 throughout; bucket 2 fell to 30.
        assert_eq!(s.values(4), vec![0, 100, 30, 230]);
    }

    #[test]
    fn halving_merges_pairs_as_each_keep_says() {
        let mut low = Series::default();
        let mut last = Series::default();
        for (b, v) in [(0, 5), (1, 3), (2, 9), (3, 7), (4, 8)] {
            low.set(b, v, Keep::Low);
            last.set(b, v, Keep::Last);
        }
        low.halve(Keep::Low);
        last.halve(Keep::Last);
        // A low-water bucket starts at the value it was entered with.
        assert_eq!(low.values(3), vec![0, 3, 7]);
        assert_eq!(last.values(3), vec![3, 7, 8]);
    }

    #[test]
    fn the_grid_doubles_past_its_last_bucket() {
        let mut g = Grid::new(1_000);
        assert!(!g.advance(1_000 + 10 * MIN_WIDTH_NS));
        assert_eq!(g.len(), 11);
        let far = 1_000 + (MAX_BUCKETS as u64) * MIN_WIDTH_NS;
        assert!(g.advance(far));
        assert_eq!(g.width_ns, 2 * MIN_WIDTH_NS);
        assert!(!g.advance(far));
        assert_eq!(g.len(), MAX_BUCKETS / 2 + 1);
    }
}
