//! The statistics of the growth analysis: a least-squares line with its slope's standard
//! error, and where a series' warm-up ends (the breakpoint of a two-line fit).

/// A straight line fitted to points by least squares.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Fit {
    /// Change of y per unit of x.
    pub slope: f64,
    /// y at x = 0.
    pub intercept: f64,
    /// The slope's standard error (infinite with fewer than three points).
    pub se: f64,
    /// Points fitted.
    pub n: usize,
}

impl Fit {
    /// How many standard errors the slope is from zero (infinite for an exact nonzero slope,
    /// 0 for an exact flat line).
    pub fn t(&self) -> f64 {
        if self.se > 0.0 {
            self.slope / self.se
        } else if self.slope == 0.0 {
            0.0
        } else {
            f64::INFINITY.copysign(self.slope)
        }
    }
}

/// Sums of a run of points, from which a line and its residual follow.
#[derive(Clone, Copy, Debug, Default)]
struct Sums {
    n: f64,
    x: f64,
    y: f64,
    xx: f64,
    xy: f64,
    yy: f64,
}

impl Sums {
    fn push(&mut self, x: f64, y: f64) {
        self.n += 1.0;
        self.x += x;
        self.y += y;
        self.xx += x * x;
        self.xy += x * y;
        self.yy += y * y;
    }

    fn minus(&self, o: &Sums) -> Sums {
        Sums {
            n: self.n - o.n,
            x: self.x - o.x,
            y: self.y - o.y,
            xx: self.xx - o.xx,
            xy: self.xy - o.xy,
            yy: self.yy - o.yy,
        }
    }

    /// The line and its sum of squared residuals; `None` with no point.
    fn line(&self) -> Option<(Fit, f64)> {
        if self.n < 1.0 {
            return None;
        }
        let sxx = self.xx - self.x * self.x / self.n;
        let sxy = self.xy - self.x * self.y / self.n;
        let syy = (self.yy - self.y * self.y / self.n).max(0.0);
        let (slope, sse) = if sxx > 0.0 {
            (sxy / sxx, (syy - sxy * sxy / sxx).max(0.0))
        } else {
            (0.0, syy)
        };
        let intercept = (self.y - slope * self.x) / self.n;
        let se = if self.n > 2.0 && sxx > 0.0 {
            (sse / (self.n - 2.0) / sxx).sqrt()
        } else {
            f64::INFINITY
        };
        Some((
            Fit {
                slope,
                intercept,
                se,
                n: self.n as usize,
            },
            sse,
        ))
    }
}

/// The least-squares line through `points`; `None` when there are none.
pub fn line(points: impl IntoIterator<Item = (f64, f64)>) -> Option<Fit> {
    let mut s = Sums::default();
    for (x, y) in points {
        s.push(x, y);
    }
    s.line().map(|(f, _)| f)
}

/// Where the warm-up of `y` (one value per bucket, evenly spaced) ends, looking from bucket
/// `from` on: the earliest breakpoint `k` of a fit by two lines, one through `y[from..k]` and
/// one through `y[k..]`, whose residual is within the noise of the best breakpoint's (4 times
/// its residual variance: the allowance of a 95% test on one added parameter). A series that
/// one line fits (flat, or growing evenly) has no warm-up (`from`); one that rises and then
/// stays has its breakpoint where it stopped rising. The second line keeps at least a quarter
/// of the buckets from `from` (and three).
pub fn warmup_end(y: &[f64], from: usize) -> usize {
    let x: Vec<f64> = (0..y.len()).map(|i| i as f64).collect();
    warmup_end_at(&x, y, from)
}

/// [`warmup_end`] with the buckets at `x` (each bucket's place on the x axis, in order: the
/// steps counted by its end when the engine's loop shows them).
pub fn warmup_end_at(x: &[f64], y: &[f64], from: usize) -> usize {
    let n = y.len().min(x.len());
    if from >= n {
        return n;
    }
    let span = n - from;
    let min_tail = (span / 4).max(3);
    if span <= min_tail {
        return from;
    }
    // Prefix sums from `from`, centred and scaled for a well-conditioned arithmetic.
    let mean = y[from..n].iter().sum::<f64>() / span as f64;
    let scale = y[from..n]
        .iter()
        .map(|v| (v - mean).abs())
        .fold(0.0, f64::max)
        .max(1.0);
    let mut prefix = Vec::with_capacity(span + 1);
    let mut s = Sums::default();
    prefix.push(s);
    let x0 = x[from];
    let x_scale = (x[n - 1] - x0).abs().max(1.0);
    for (i, v) in y[from..n].iter().enumerate() {
        s.push((x[from + i] - x0) / x_scale, (v - mean) / scale);
        prefix.push(s);
    }
    let sse = |a: usize, b: usize| prefix[b].minus(&prefix[a]).line().map_or(0.0, |(_, e)| e);
    let costs: Vec<(usize, f64)> = (0..=span - min_tail)
        .map(|k| (k, sse(0, k) + sse(k, span)))
        .collect();
    let best = costs.iter().map(|c| c.1).fold(f64::INFINITY, f64::min);
    let variance = best / (span.saturating_sub(4).max(1)) as f64;
    let allowance = 4.0 * variance + 1e-12;
    costs
        .iter()
        .find(|c| c.1 <= best + allowance)
        .map_or(from, |c| from + c.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_and_its_standard_error() {
        let f = line((0..10).map(|i| (i as f64, 3.0 * i as f64 + 1.0))).unwrap();
        assert!((f.slope - 3.0).abs() < 1e-12 && (f.intercept - 1.0).abs() < 1e-9);
        assert_eq!(f.se, 0.0);
        assert_eq!(f.t(), f64::INFINITY);
        let noisy = line((0..10).map(|i| (i as f64, if i % 2 == 0 { 1.0 } else { -1.0 }))).unwrap();
        assert!(noisy.se > 0.0 && noisy.t().abs() < 1.0, "{noisy:?}");
        assert!(line(std::iter::empty()).is_none());
    }

    #[test]
    fn the_warm_up_ends_where_a_rise_stops() {
        let plateau: Vec<f64> = (0..100).map(|i| (i.min(30) * 10) as f64).collect();
        assert_eq!(warmup_end(&plateau, 0), 30);
        let flat = vec![7.0; 100];
        assert_eq!(warmup_end(&flat, 5), 5);
        let leak: Vec<f64> = (0..100).map(|i| (i * 4) as f64).collect();
        assert_eq!(warmup_end(&leak, 0), 0);
        // A noisy plateau: within a few buckets of the knee.
        let noisy: Vec<f64> = (0..200)
            .map(|i| (i.min(80) * 10) as f64 + if i % 3 == 0 { 4.0 } else { -2.0 })
            .collect();
        let k = warmup_end(&noisy, 0);
        assert!((78..=84).contains(&k), "{k}");
    }
}
