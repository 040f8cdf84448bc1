//! The accuracy tables of `docs/accuracy.md`: every algorithm driven on the
//! in-memory backend under a manual clock (see `ratewall_examples::accuracy`).
//!
//! ```text
//! cargo run --release -p ratewall-examples --example accuracy            # full: docs/accuracy/
//! cargo run --release -p ratewall-examples --example accuracy -- --quick # smaller: target/accuracy-quick/
//! ```
//!
//! `--out DIR` writes elsewhere. Every table is printed and written as
//! markdown (`results.md`) and CSV beside it.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::Instant;

use ratewall::{Algorithm, Limit};
use ratewall_examples::accuracy::{
    Arrivals, Tally, adversarial_worst, judge, limit, random_search, saturating_rate,
};

/// One second, the period of every limit here.
const P: u64 = 1_000_000;

struct Settings {
    quick: bool,
    thresholds: Vec<u64>,
    restarts: u32,
    steps: u32,
    rate_periods: u64,
    rate_budget: u64,
    calls_per_cell: u64,
    min_periods: u64,
}

impl Settings {
    /// Periods a saturating client runs at threshold `t`: `rate_periods`,
    /// or fewer when that would admit more than `rate_budget` units.
    fn rate_periods(&self, t: u64) -> u64 {
        self.rate_periods.min(self.rate_budget / t)
    }

    fn new(quick: bool) -> Self {
        if quick {
            Self {
                quick,
                thresholds: vec![1, 10, 100],
                restarts: 2,
                steps: 150,
                rate_periods: 1_000,
                rate_budget: 100_000,
                calls_per_cell: 40_000,
                min_periods: 50,
            }
        } else {
            Self {
                quick,
                thresholds: vec![1, 10, 100, 1000],
                restarts: 8,
                steps: 400,
                rate_periods: 10_000,
                rate_budget: 1_000_000,
                calls_per_cell: 400_000,
                min_periods: 200,
            }
        }
    }
}

/// The limits compared at threshold `t`, with their names in the tables:
/// each algorithm with its defaults (burst `T`, 10 slots), the
/// sliding-window counter also at 2 and 100 slots, and GCRA with a burst of 1.
fn limits(t: u64) -> Vec<(String, Limit)> {
    let mut all = Vec::new();
    for algorithm in Algorithm::ALL {
        if algorithm == Algorithm::SlidingWindow {
            for slots in [2, 10, 100] {
                all.push((
                    format!("{algorithm} N={slots}"),
                    limit(algorithm, t, P, t, slots),
                ));
            }
        } else {
            all.push((algorithm.to_string(), limit(algorithm, t, P, t, 10)));
        }
    }
    all.push(("gcra B=1".to_string(), limit(Algorithm::Gcra, t, P, 1, 10)));
    all
}

/// The README's claim (before this simulation) for the worst case in a
/// window of length `P`: its formula, and its value for `limit`.
fn claim(limit: &Limit) -> (&'static str, String) {
    let (t, b) = (limit.threshold(), limit.burst());
    match limit.algorithm() {
        Algorithm::FixedWindow => ("2T", (2 * t).to_string()),
        Algorithm::SlidingLog => ("T", t.to_string()),
        Algorithm::SlidingWindow => ("< 2T", format!("< {}", 2 * t)),
        _ => ("burst + T", (b + t).to_string()),
    }
}

/// A markdown table and its CSV.
struct Table {
    name: &'static str,
    header: Vec<String>,
    rows: Vec<Vec<String>>,
}

impl Table {
    fn new(name: &'static str, header: &[&str]) -> Self {
        Self {
            name,
            header: header.iter().map(|h| h.to_string()).collect(),
            rows: Vec::new(),
        }
    }

    fn markdown(&self) -> String {
        let mut out = format!("| {} |\n|", self.header.join(" | "));
        out.push_str(&"---|".repeat(self.header.len()));
        out.push('\n');
        for row in &self.rows {
            let _ = writeln!(out, "| {} |", row.join(" | "));
        }
        out
    }

    fn csv(&self) -> String {
        let mut out = self.header.join(",") + "\n";
        for row in &self.rows {
            out.push_str(&row.join(","));
            out.push('\n');
        }
        out
    }

    /// The rows that `keep` keeps, regrouped: one row per distinct value of
    /// the columns `by`, one column per distinct value of column `across`
    /// (in order of appearance), each cell made by `cell` from a row.
    fn pivot(
        &self,
        name: &'static str,
        keep: impl Fn(&[String]) -> bool,
        by: &[usize],
        across: usize,
        cell: impl Fn(&[String]) -> String,
    ) -> Table {
        let kept: Vec<&Vec<String>> = self.rows.iter().filter(|r| keep(r)).collect();
        let mut columns: Vec<String> = Vec::new();
        let mut keys: Vec<Vec<String>> = Vec::new();
        for row in &kept {
            let key: Vec<String> = by.iter().map(|&i| row[i].clone()).collect();
            if !keys.contains(&key) {
                keys.push(key);
            }
            if !columns.contains(&row[across]) {
                columns.push(row[across].clone());
            }
        }
        let mut header: Vec<String> = by.iter().map(|&i| self.header[i].clone()).collect();
        header.extend(
            columns
                .iter()
                .map(|c| format!("{} = {c}", self.header[across])),
        );
        let rows = keys
            .into_iter()
            .map(|key| {
                let mut out = key.clone();
                for column in &columns {
                    let found = kept.iter().find(|r| {
                        &r[across] == column && by.iter().zip(&key).all(|(&i, k)| &r[i] == k)
                    });
                    out.push(found.map_or("—".to_string(), |r| cell(r)));
                }
                out
            })
            .collect();
        Table { name, header, rows }
    }
}

fn worst_case(settings: &Settings) -> Table {
    let mut table = Table::new(
        "worst_case",
        &[
            "algorithm",
            "T",
            "claim",
            "claimed",
            "adversary [t,t+P)",
            "found by",
            "random search [t,t+P)",
            "adversary [t,t+P]",
        ],
    );
    for &t in &settings.thresholds {
        let mut configs = limits(t);
        if t == 10 {
            for algorithm in [
                Algorithm::TokenBucket,
                Algorithm::LeakyBucket,
                Algorithm::Gcra,
            ] {
                configs.push((
                    format!("{algorithm} B=30"),
                    limit(algorithm, t, P, 3 * t, 10),
                ));
            }
        }
        for (i, (name, config)) in configs.iter().enumerate() {
            let (open, adversary, closed) = adversarial_worst(*config);
            let seed = 0xACC0_0000 + 100 * t + i as u64;
            let searched = random_search(*config, seed, settings.restarts, settings.steps);
            let (formula, value) = claim(config);
            table.rows.push(vec![
                name.clone(),
                t.to_string(),
                formula.to_string(),
                value,
                open.to_string(),
                adversary.name().to_string(),
                searched.to_string(),
                closed.to_string(),
            ]);
        }
    }
    table
}

fn long_run(settings: &Settings, loose: &mut u64) -> Table {
    let mut table = Table::new(
        "long_run",
        &["algorithm", "T", "admitted per P", "per P / T", "periods"],
    );
    for &t in &settings.thresholds {
        for (name, config) in limits(t) {
            let periods = settings.rate_periods(t);
            let (rate, bad) = saturating_rate(config, periods);
            *loose += bad;
            table.rows.push(vec![
                name,
                t.to_string(),
                format!("{rate:.3}"),
                format!("{:.4}", rate / t as f64),
                periods.to_string(),
            ]);
        }
    }
    table
}

fn sliding_window_rate(settings: &Settings, loose: &mut u64) -> Table {
    let mut table = Table::new(
        "sliding_window_rate",
        &[
            "T",
            "N",
            "admitted per P",
            "per P / T",
            "N/(N+1)",
            "max(N/(N+1), (T-1)/T)",
        ],
    );
    for t in [1, 2, 3, 5, 10, 20, 50, 100, 1000] {
        for slots in [1, 2, 4, 10, 100] {
            let config = limit(Algorithm::SlidingWindow, t, P, t, slots);
            let periods = settings.rate_periods(t);
            let (rate, bad) = saturating_rate(config, periods);
            *loose += bad;
            table.rows.push(vec![
                t.to_string(),
                slots.to_string(),
                format!("{rate:.3}"),
                format!("{:.4}", rate / t as f64),
                format!("{:.4}", slots as f64 / (slots + 1) as f64),
                format!(
                    "{:.4}",
                    (slots as f64 / (slots + 1) as f64).max((t - 1) as f64 / t as f64)
                ),
                periods.to_string(),
            ]);
        }
    }
    table
}

const LOADS: [f64; 3] = [0.5, 1.0, 2.0];

fn wrong_decisions(settings: &Settings) -> Table {
    let mut table = Table::new(
        "wrong_decisions",
        &[
            "arrivals",
            "algorithm",
            "T",
            "load",
            "calls",
            "admitted per P",
            "over %",
            "under %",
            "wrong %",
            "max in [t,t+P)",
        ],
    );
    for arrivals in [Arrivals::Poisson, Arrivals::Batches] {
        for &t in &settings.thresholds {
            for (l, &load) in LOADS.iter().enumerate() {
                let rate = load * t as f64 / P as f64;
                let periods = (settings.calls_per_cell as f64 / (load * t as f64)).ceil() as u64;
                let periods = periods.max(settings.min_periods);
                let seed = 0x5EED_0000 + 1_000 * t + 10 * l as u64 + arrivals as u64;
                let times = arrivals.times(rate, periods * P, seed);
                for (name, config) in limits(t) {
                    let tally: Tally = judge(config, &times);
                    table.rows.push(vec![
                        arrivals.name().to_string(),
                        name,
                        t.to_string(),
                        format!("{load}"),
                        tally.calls.to_string(),
                        format!("{:.3}", tally.admitted as f64 / periods as f64),
                        format!("{:.3}", tally.over_percent()),
                        format!("{:.3}", tally.under_percent()),
                        format!("{:.3}", tally.wrong_percent()),
                        tally.worst_window.to_string(),
                    ]);
                }
            }
        }
    }
    table
}

/// A wrong-decisions cell: over % / under % (admitted per P).
fn wrong_cell(row: &[String]) -> String {
    let percent = |i: usize| row[i].parse::<f64>().unwrap_or(f64::NAN);
    format!("{:.2} / {:.2} ({})", percent(6), percent(7), row[5])
}

fn main() -> std::io::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let quick = args.iter().any(|a| a == "--quick");
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let out = match args.iter().position(|a| a == "--out") {
        Some(i) => PathBuf::from(args.get(i + 1).expect("--out DIR")),
        None if quick => root.join("target/accuracy-quick"),
        None => root.join("docs/accuracy"),
    };
    let settings = Settings::new(quick);
    let started = Instant::now();
    let mut loose = 0;
    let mut tables = Vec::new();
    for step in 0..4 {
        let step_started = Instant::now();
        let table = match step {
            0 => worst_case(&settings),
            1 => long_run(&settings, &mut loose),
            2 => sliding_window_rate(&settings, &mut loose),
            _ => wrong_decisions(&settings),
        };
        eprintln!("{}: {:.1?}", table.name, step_started.elapsed());
        tables.push(table);
    }

    let summaries = [
        tables[0].pivot(
            "summary_worst_case",
            |_| true,
            &[0],
            1,
            |r| format!("{} / {} (claim {})", r[4], r[6], r[3]),
        ),
        tables[1].pivot("summary_long_run", |_| true, &[0], 1, |r| r[3].clone()),
        tables[2].pivot(
            "summary_sliding_window_rate",
            |_| true,
            &[0],
            1,
            |r| format!("{} ({})", r[3], r[5]),
        ),
        tables[3].pivot(
            "summary_wrong_poisson",
            |r| r[0] == "poisson",
            &[1, 2],
            3,
            wrong_cell,
        ),
        tables[3].pivot(
            "summary_wrong_batches",
            |r| r[0] == "batches",
            &[1, 2],
            3,
            wrong_cell,
        ),
    ];

    let summaries: Vec<Table> = summaries
        .into_iter()
        .chain([tables[3].pivot(
            "summary_max_in_window_poisson_2x",
            |r| r[0] == "poisson" && r[3] == "2",
            &[1],
            2,
            |r| r[9].clone(),
        )])
        .collect();

    std::fs::create_dir_all(&out)?;
    let mode = if settings.quick { "--quick" } else { "full" };
    let command = format!(
        "cargo run --release -p ratewall-examples --example accuracy{}",
        if settings.quick { " -- --quick" } else { "" }
    );
    let mut markdown = format!(
        "# Accuracy results ({mode} run)\n\nWritten by `{command}`; read with \
         `docs/accuracy.md`, which explains every column. P = 1 s for every limit. \
         Loose `retry_after`s seen by the saturating client: {loose}.\n"
    );
    for table in summaries.iter().chain(&tables) {
        let _ = write!(markdown, "\n## {}\n\n{}", table.name, table.markdown());
        std::fs::write(out.join(format!("{}.csv", table.name)), table.csv())?;
    }
    std::fs::write(out.join("results.md"), &markdown)?;
    println!("{markdown}");
    eprintln!(
        "wrote {} in {:.1?}",
        out.join("results.md").display(),
        started.elapsed()
    );
    Ok(())
}
