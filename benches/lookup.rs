//! What one `series_of` costs on a state directory, one thread, no HTTP
//! (docs/PERFORMANCE.md, query API):
//!
//!   lookup STATE_DIR IDS_FILE [ROUNDS]
//!
//! STATE_DIR is one partition's state (`replay --state-dir`). Each round
//! looks up every id of IDS_FILE (the partition holds them) and the same
//! ids with a prefix no inference has (the partitions that do not hold
//! an inference: three of four in a 4-partition group), and prints the
//! mean microseconds per lookup: what the query API spends in RocksDB per
//! partition (a held id: its series and voters; an absent one: the series
//! scan its prefix filters answer), without HTTP and without contention.

use std::time::Instant;

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    if args.len() < 2 {
        eprintln!("usage: lookup STATE_DIR IDS_FILE [ROUNDS]");
        std::process::exit(2);
    }
    let rounds: usize = args.get(2).map_or(3, |r| r.parse().expect("ROUNDS"));
    let store = jurystream::state::Store::open(std::path::Path::new(&args[0])).expect("open");
    let ids: Vec<String> = std::fs::read_to_string(&args[1])
        .expect("ids")
        .lines()
        .filter(|l| !l.is_empty())
        .map(str::to_owned)
        .collect();
    let absent: Vec<String> = ids.iter().map(|i| format!("absent-{i}")).collect();
    for round in 1..=rounds {
        for (label, set) in [("held", &ids), ("absent", &absent)] {
            let started = Instant::now();
            let mut found = 0usize;
            for id in set {
                found += store.series_of(id).expect("series_of").len();
                if label == "held" {
                    found += store.voters_of(id, 1000).expect("voters_of").len();
                }
            }
            let us = started.elapsed().as_secs_f64() * 1e6 / set.len() as f64;
            println!(
                "round {round} {label:6} {:>7} lookups {us:8.2} µs each ({found} found)",
                set.len()
            );
        }
    }
}
