//! What one table's pair fit costs (`engine::reputation::pairs::fit`, 100
//! rounds), one thread:
//!
//!   pair_fit [REVIEWERS] [PARTNERS] [ROUNDS]
//!
//! A planted crowd of REVIEWERS reviewers (10 000 by default), each
//! co-reviewing with the next PARTNERS (20) in a ring, 50 co-votes per
//! pair in their expected split (π = 0.3, se and sp spread over 0.55–0.95,
//! one in ten turned around). Prints the milliseconds per fit (best of
//! ROUNDS, 3) and the nanoseconds per pair and EM round.

use std::time::Instant;

use jurystream::engine::reputation::pairs::{fit, PairCount, PairParams};

fn main() {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .map(|a| a.parse().expect("a number"))
        .collect();
    let reviewers = args.first().copied().unwrap_or(10_000);
    let partners = args.get(1).copied().unwrap_or(20).min(reviewers - 1);
    let rounds = args.get(2).copied().unwrap_or(3);
    // A small LCG: the same crowd every run, no dependency.
    let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = || {
        state = state
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1);
        (state >> 11) as f64 / (1u64 << 53) as f64
    };
    let rates: Vec<(f64, f64)> = (0..reviewers)
        .map(|i| {
            let (se, sp) = (0.55 + 0.4 * next(), 0.55 + 0.4 * next());
            if i % 10 == 9 {
                (1.0 - se, 1.0 - sp)
            } else {
                (se, sp)
            }
        })
        .collect();
    let pi = 0.3;
    let mut pairs = Vec::with_capacity(reviewers * partners);
    for a in 0..reviewers {
        for k in 1..=partners {
            let b = (a + k) % reviewers;
            let (lo, hi) = (a.min(b), a.max(b));
            let mut counts = [0u64; 4];
            for (cell, n) in counts.iter_mut().enumerate() {
                let (vl, vh) = (cell >> 1, cell & 1);
                let p1 = |(se, _): (f64, f64), v| if v == 1 { se } else { 1.0 - se };
                let p0 = |(_, sp): (f64, f64), v| if v == 1 { 1.0 - sp } else { sp };
                let p = pi * p1(rates[lo], vl) * p1(rates[hi], vh)
                    + (1.0 - pi) * p0(rates[lo], vl) * p0(rates[hi], vh);
                *n = (50.0 * p).round() as u64;
            }
            pairs.push(PairCount {
                a: lo,
                b: hi,
                counts,
            });
        }
    }
    pairs.sort_unstable_by_key(|p| (p.a, p.b));
    let params = PairParams::default();
    let mut best = f64::INFINITY;
    for _ in 0..rounds {
        let t = Instant::now();
        let f = fit(reviewers, &pairs, None, &params).expect("a fit");
        best = best.min(t.elapsed().as_secs_f64());
        std::hint::black_box(f);
    }
    println!(
        "reviewers {reviewers} pairs {} rounds {}: {:.1} ms per fit, {:.2} ns per pair and round",
        pairs.len(),
        params.rounds,
        best * 1e3,
        best * 1e9 / (pairs.len() as f64 * f64::from(params.rounds))
    );
}
