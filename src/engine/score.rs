//! The scoring math of contract §3 and §13: pure functions of numbers, nothing
//! else.

/// How a batch's votes become one aggregate `a`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Aggregator {
    Mean,
    PowerMean,
}

impl Aggregator {
    pub fn as_str(self) -> &'static str {
        match self {
            Aggregator::Mean => "mean",
            Aggregator::PowerMean => "power_mean",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "mean" => Some(Aggregator::Mean),
            "power_mean" => Some(Aggregator::PowerMean),
            _ => None,
        }
    }
}

/// The unit Δt is expressed in before `α = exp(−λ Δt)`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum TimeUnit {
    Seconds,
    Minutes,
    Hours,
    Days,
}

impl TimeUnit {
    pub fn as_str(self) -> &'static str {
        match self {
            TimeUnit::Seconds => "seconds",
            TimeUnit::Minutes => "minutes",
            TimeUnit::Hours => "hours",
            TimeUnit::Days => "days",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "seconds" => Some(TimeUnit::Seconds),
            "minutes" => Some(TimeUnit::Minutes),
            "hours" => Some(TimeUnit::Hours),
            "days" => Some(TimeUnit::Days),
            _ => None,
        }
    }

    pub fn seconds(self) -> f64 {
        match self {
            TimeUnit::Seconds => 1.0,
            TimeUnit::Minutes => 60.0,
            TimeUnit::Hours => 3600.0,
            TimeUnit::Days => 86_400.0,
        }
    }
}

/// Weighted mean and weighted population variance about it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Moments {
    pub weight_sum: f64,
    pub mean: f64,
    pub variance: f64,
    /// `D = Σ r² / (Σ r)²` (contract §13): 1/n for n equal weights.
    pub concentration: f64,
}

/// `m = Σ r v / Σ r`, `σ² = Σ r (v − m)² / Σ r`, `D = Σ r² / (Σ r)²`,
/// summed in the given order. `votes` holds `(v, r)` pairs and must not be
/// empty.
pub fn moments(votes: &[(f64, f64)]) -> Moments {
    let mut weight_sum = 0.0;
    let mut weight_sq = 0.0;
    let mut weighted = 0.0;
    for &(v, r) in votes {
        weight_sum += r;
        weight_sq += r * r;
        weighted += r * v;
    }
    let mean = weighted / weight_sum;
    let mut sq = 0.0;
    for &(v, r) in votes {
        let d = v - mean;
        sq += r * d * d;
    }
    Moments {
        weight_sum,
        mean,
        variance: sq / weight_sum,
        concentration: weight_sq / (weight_sum * weight_sum),
    }
}

/// z of a two-sided 95 % interval.
pub const Z95: f64 = 1.959963984540054;

/// How much evidence is behind a score (contract §13), kept per series beside
/// it: `v`, the share of the score that comes from votes rather than from
/// the initial score, and `q`, the sum of the squared weights the votes
/// have in the score (so that `v² / q` is Kish's effective sample size).
/// Both start at 0.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Evidence {
    pub v: f64,
    pub q: f64,
}

impl Evidence {
    /// After an update with decay `alpha` of a batch with weight
    /// concentration `d` ([`Moments::concentration`]):
    /// `V = α V + (1 − α)`, `Q = α² Q + (1 − α)² D`.
    pub fn update(self, alpha: f64, d: f64) -> Evidence {
        self.step(alpha, 1.0 - alpha, d)
    }

    /// [`Evidence::update`] with a step of `beta` and `kappa` for what is
    /// kept (`learned` mode's damped step, contract §14; κ = α, β = 1 − α
    /// otherwise): `V = κ V + β`, `Q = κ² Q + β² D`.
    pub fn step(self, kappa: f64, beta: f64, d: f64) -> Evidence {
        Evidence {
            v: kappa * self.v + beta,
            q: kappa * kappa * self.q + beta * beta * d,
        }
    }

    /// `V² / Q`; None while there is no evidence (V = 0 or Q = 0).
    pub fn effective_votes(self) -> Option<f64> {
        (self.v != 0.0 && self.q != 0.0).then(|| self.v * self.v / self.q)
    }

    /// The 95 % interval of `score` (contract §13): the Wilson interval of the
    /// votes' part of the score, p̂ = (S − (1 − V) S₀) / V, with
    /// n = [`Evidence::effective_votes`], mapped back through
    /// S = (1 − V) S₀ + V p̂. None while there is no evidence.
    pub fn interval(self, score: f64, initial_score: f64) -> Option<(f64, f64)> {
        let n = self.effective_votes()?;
        let prior = (1.0 - self.v) * initial_score;
        let p = ((score - prior) / self.v).clamp(0.0, 1.0);
        let (low, high) = wilson(p, n);
        Some((prior + self.v * low, prior + self.v * high))
    }
}

/// The 95 % Wilson score interval for a proportion `p` of `n` trials.
pub fn wilson(p: f64, n: f64) -> (f64, f64) {
    let z2 = Z95 * Z95;
    let denom = 1.0 + z2 / n;
    let center = (p + z2 / (2.0 * n)) / denom;
    let half = Z95 / denom * (p * (1.0 - p) / n + z2 / (4.0 * n * n)).sqrt();
    (center - half, center + half)
}

/// The exponent eval-lib maps a temperature to: `p = −8 + (τ − 0.1)/0.9 × 20.25`.
pub fn power_exponent(temperature: f64) -> f64 {
    -8.0 + (temperature - 0.1) / 0.9 * 20.25
}

/// The weighted form of eval-lib's `score_agg` (before its rounding).
pub fn power_mean(votes: &[(f64, f64)], temperature: f64) -> f64 {
    power_mean_of(votes, temperature, votes.len())
}

/// [`power_mean`] whose `k` counts `n` votes: contract §15's prior is one
/// more value in the sums but not a vote.
pub fn power_mean_of(votes: &[(f64, f64)], temperature: f64, n: usize) -> f64 {
    let p = power_exponent(temperature);
    let geometric = p.abs() < 1e-12;
    let zero_floor = p < 0.0 || geometric;
    let mut weight_sum = 0.0;
    let mut acc = 0.0;
    let mut none_weight = 0.0;
    for &(v, r) in votes {
        weight_sum += r;
        if v == 0.0 {
            none_weight += r;
        }
        let x = if zero_floor && v == 0.0 { 1e-9 } else { v };
        acc += if geometric { r * x.ln() } else { r * x.powf(p) };
    }
    let m = if geometric {
        (acc / weight_sum).exp()
    } else {
        (acc / weight_sum).powf(1.0 / p)
    };
    let none_frac = none_weight / weight_sum;
    let n = n as f64;
    let k = (1.5 - temperature) * f64::min(1.0, (n - 1.0) / 4.0);
    m * (1.0 - none_frac).powf(k)
}

/// The aggregate `a` of a batch.
pub fn aggregate(votes: &[(f64, f64)], mean: f64, aggregator: Aggregator, temperature: f64) -> f64 {
    match aggregator {
        Aggregator::Mean => mean,
        Aggregator::PowerMean => power_mean(votes, temperature),
    }
}

/// `α = exp(−λ Δt)` with Δt in `unit`; `delta_t_seconds` ≥ 0.
pub fn decay(lambda: f64, delta_t_seconds: f64, unit: TimeUnit) -> f64 {
    (-lambda * (delta_t_seconds / unit.seconds())).exp()
}

/// `S_new = α S + (1 − α) a`.
pub fn update(alpha: f64, previous: f64, aggregate: f64) -> f64 {
    step(alpha, 1.0 - alpha, previous, aggregate)
}

/// `S_new = κ S + β a`: [`update`] with `learned` mode's damped step
/// (contract §14).
pub fn step(kappa: f64, beta: f64, previous: f64, aggregate: f64) -> f64 {
    kappa * previous + beta * aggregate
}

/// Ambiguous when there are at least `min_votes` votes and `σ² > threshold` (strict).
pub fn is_ambiguous(n: usize, variance: f64, min_votes: u32, threshold: f64) -> bool {
    n as u64 >= u64::from(min_votes) && variance > threshold
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64, tol: f64) -> bool {
        (a - b).abs() <= tol
    }

    #[test]
    fn humanjudge_worked_check() {
        let alpha = decay(0.01, 7.0, TimeUnit::Seconds);
        assert!(close(alpha, 0.9324, 5e-5), "{alpha}");
        let s = update(alpha, 0.5, 0.0);
        assert!(close(s, 0.4662, 5e-5), "{s}");
        assert!(close(1.0 - alpha, 0.0676, 5e-5));
    }

    #[test]
    fn grandjury_worked_check() {
        let alpha = decay(0.1, 3.0 * 86_400.0, TimeUnit::Days);
        assert!(close(alpha, 0.7408, 5e-5), "{alpha}");
    }

    #[test]
    fn variance_worked_checks() {
        let m = moments(&[(1.0, 1.0), (0.0, 1.0), (0.0, 1.0)]);
        assert!(close(m.variance, 0.2222, 5e-5));
        assert!(is_ambiguous(3, m.variance, 2, 0.05));
        let m = moments(&[(0.9, 1.0), (0.8, 1.0), (0.6, 1.0)]);
        assert!(close(m.variance, 0.0156, 5e-5));
        assert!(!is_ambiguous(3, m.variance, 2, 0.05));
    }

    #[test]
    fn reputation_worked_check() {
        let votes = [(0.8, 1.0), (0.6, 0.8), (0.9, 1.2), (0.7, 0.9), (0.5, 0.7)];
        let m = moments(&votes);
        let alpha = decay(0.01, 7200.0, TimeUnit::Seconds);
        let s = update(alpha, 0.5, m.mean);
        assert!(close(s, 0.7261, 5e-5), "{s}");
        assert!(close(1.0 - alpha, 1.0, 5e-5));
    }

    #[test]
    fn threshold_is_strict_and_min_votes_counts() {
        assert!(!is_ambiguous(2, 0.05, 2, 0.05));
        assert!(!is_ambiguous(1, 0.25, 2, 0.05));
        assert!(is_ambiguous(1, 0.25, 1, 0.05));
    }

    #[test]
    fn power_mean_at_half_temperature_is_the_mean() {
        assert_eq!(power_exponent(0.5), 1.0);
        let votes = [(0.2, 1.0), (0.9, 1.0), (0.7, 1.0)];
        let mean = moments(&votes).mean;
        // p = 1, no zero votes: M is the mean; k > 0 but none_frac = 0.
        assert!(close(power_mean(&votes, 0.5), mean, 1e-12));
    }

    #[test]
    fn power_mean_matches_eval_lib_by_hand() {
        // τ = 0.1 → p = −8; one zero vote floored at 1e-9 dominates M.
        let votes = [(1.0, 1.0), (0.0, 1.0)];
        let p = -8.0f64;
        let m = ((1.0f64.powf(p) + 1e-9f64.powf(p)) / 2.0).powf(1.0 / p);
        let k = (1.5 - 0.1) * (1.0f64 / 4.0);
        let want = m * (1.0f64 - 0.5).powf(k);
        assert!(close(power_mean(&votes, 0.1), want, 1e-15));
        // The geometric point.
        let tau = 0.1 + 8.0 / 20.25 * 0.9;
        assert!(power_exponent(tau).abs() < 1e-12);
        let g = power_mean(&[(0.25, 1.0), (1.0, 1.0)], tau);
        let k = (1.5 - tau) * 0.25;
        assert!(close(g, 0.5 * 1.0f64.powf(k), 1e-12));
        // All zero: M = 1e-9 (floored), none_frac = 1 → a = 0 unless k = 0.
        assert_eq!(power_mean(&[(0.0, 1.0), (0.0, 1.0)], 0.1), 0.0);
        assert!(close(power_mean(&[(0.0, 1.0)], 0.1), 1e-9, 1e-18));
    }

    #[test]
    fn weights_act_like_repetition() {
        let a = power_mean(&[(0.3, 2.0), (0.8, 1.0)], 0.8);
        let b = power_mean(&[(0.3, 1.0), (0.3, 1.0), (0.8, 1.0)], 0.8);
        // M and none_frac agree; k depends on n, so compare with n fixed.
        let p = power_exponent(0.8);
        let m = ((2.0 * 0.3f64.powf(p) + 0.8f64.powf(p)) / 3.0).powf(1.0 / p);
        assert!(close(a, m, 1e-12));
        assert!(close(b, m, 1e-12));
    }
}
