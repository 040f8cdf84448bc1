//! In-memory decisions per second against identities and threads, beside
//! `governor` (keyed, `u64` keys, GCRA), and the memory each live identity
//! takes: the in-memory half of the scale measurements (the Redis half is
//! `ratewall-redis`'s `loadgen --compare-coalesce`).
//!
//! ```text
//! cargo run --release -p ratewall-benches --example memory_identities -- \
//!     --ids 1,1000,100000,1000000,10000000 --threads 1,2 --rounds 3 --out target/memory-identities
//! ```
//!
//! Each cell (a side, a count of identities per thread, a count of
//! threads) runs in a process of its own (this binary, re-run with `cell`),
//! so that no cell sees another's memory or warm tables. In a cell, every
//! thread first decides each of its own identities once (the warm-up: the
//! state of every identity exists, all of them live until the cell ends),
//! then, timed, decides `--decisions` more (default 4 000 000 per thread)
//! over them in a scattered order (a stride prime to the count), every one
//! allowed (checked). Sides:
//! - `annotated`: a `#[rate_limit(key = user)] async fn(user: u64)` on the
//!   global in-memory limiter, polled once with a no-op waker (it never
//!   suspends in memory), its limit set at run time so that no identity is
//!   refused and every state lives through the cell (GCRA, a day);
//! - `governor`: `RateLimiter::keyed` `check_key(&u64)`, one limiter shared
//!   by the threads.
//!
//! The rounds alternate which side runs first. Prints one table (medians
//! of the rounds, and ours ÷ `governor`), and writes it as
//! `memory_identities.md`, `.csv` and `.json`, with a plot
//! (`memory_identities.png`: decisions/s and bytes per identity against
//! identities) under `--out`. Bytes per identity: the growth of the resident
//! set over the warm-up (`/proc/self/statm`) over the identities, shown
//! from 100 000 identities per thread (below, a few pages dominate).

use std::fmt::Write as _;
use std::num::NonZeroU32;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Barrier;
use std::time::{Duration, Instant};

use governor::{Quota, RateLimiter};
use plotters::prelude::*;
use plotters::style::FontStyle;
use ratewall::{Algorithm, Limit, Limiter, Rejection, rate_limit};
use serde::Serialize;

#[path = "../support/in_memory.rs"]
mod in_memory;
use in_memory::{now, rss};

/// A day's limit, set again per cell (`Settings::set_limits`) so that no
/// identity is refused.
#[rate_limit(period = 86400, threshold = 50_000, key = user, name = "identities")]
async fn annotated(user: u64) -> Result<u64, Rejection> {
    Ok(user)
}

/// A stride prime to every count of identities asked for (they are
/// decided in the order `i * STRIDE mod count`).
const STRIDE: u64 = 7_919;

/// The identity of thread `thread`'s `index`th: each thread its own.
fn identity(thread: usize, index: u64) -> u64 {
    ((thread as u64) << 40) | index
}

/// What one cell measured.
#[derive(Debug, Clone, Copy, Serialize, serde::Deserialize)]
struct Cell {
    decisions_per_s: f64,
    bytes_per_identity: f64,
}

/// Runs one cell in this process: `side` with `ids` identities per thread
/// on `threads` threads, `decisions` timed decisions per thread.
fn cell(side: &str, ids: u64, threads: usize, decisions: u64) -> Cell {
    // Decides identity `user`; true when allowed.
    let decide: Box<dyn Fn(u64) -> bool + Sync> = match side {
        "annotated" => {
            Limiter::builder().memory().install().expect("install");
            // Every identity is decided at most `visits` times: a limit of
            // twice that never refuses. Its period is a day, or as much as
            // keeps threshold × period exact (below 2^52 µs): each visit
            // takes a slice of it (over a minute from 1 000 identities up,
            // 62 µs for one identity visited every fraction of one), so
            // every state lives through the cell.
            let visits = decisions / ids + 2;
            let threshold = 2 * visits + 1_000;
            let period = (4_000_000_000_000_000 / threshold).min(86_400_000_000);
            let limit = Limit::new(threshold, Duration::from_micros(period))
                .and_then(|l| l.with_algorithm(Algorithm::Gcra))
                .expect("limit");
            Limiter::global()
                .expect("installed")
                .settings()
                .set_limits("identities", vec![limit])
                .expect("set");
            Box::new(|user| now(annotated(user)).is_ok_and(|u| u == user))
        }
        "governor" => {
            let governor = RateLimiter::keyed(Quota::per_second(NonZeroU32::MAX));
            Box::new(move |user| governor.check_key(&user).is_ok())
        }
        other => panic!("unknown side {other:?}: expected `annotated` or `governor`"),
    };
    // The limiter, its shards and the resolved call exist before the
    // first measure.
    assert!(decide(u64::MAX), "warm-up refused");
    let before = rss();
    let warm = Barrier::new(threads + 1);
    let go = Barrier::new(threads + 1);
    let done = Barrier::new(threads + 1);
    let (after, elapsed) = std::thread::scope(|s| {
        for thread in 0..threads {
            let (decide, warm, go, done) = (&decide, &warm, &go, &done);
            s.spawn(move || {
                for index in 0..ids {
                    assert!(decide(identity(thread, index)), "warm-up refused");
                }
                warm.wait();
                go.wait();
                let mut refused = 0u64;
                for i in 0..decisions {
                    let index = (i * STRIDE) % ids;
                    refused += u64::from(!decide(std::hint::black_box(identity(thread, index))));
                }
                done.wait();
                assert_eq!(refused, 0, "{side}: refused {refused}");
            });
        }
        warm.wait();
        let after = rss();
        go.wait();
        let started = Instant::now();
        done.wait();
        (after, started.elapsed())
    });
    Cell {
        decisions_per_s: (decisions * threads as u64) as f64 / elapsed.as_secs_f64(),
        bytes_per_identity: after.saturating_sub(before) as f64 / (ids * threads as u64) as f64,
    }
}

/// One side, identities and threads, as the medians of its rounds.
#[derive(Debug, Clone, Serialize)]
struct Row {
    ids_per_thread: u64,
    threads: usize,
    annotated: Cell,
    governor: Cell,
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    let n = values.len();
    if n % 2 == 1 {
        values[n / 2]
    } else {
        (values[n / 2 - 1] + values[n / 2]) / 2.0
    }
}

/// Runs one cell in a child process.
fn child(side: &str, ids: u64, threads: usize, decisions: u64) -> Cell {
    let exe = std::env::current_exe().expect("this binary");
    let out = Command::new(exe)
        .args([
            "cell",
            side,
            &ids.to_string(),
            &threads.to_string(),
            &decisions.to_string(),
        ])
        .output()
        .expect("run one cell");
    assert!(
        out.status.success(),
        "{side} {ids}×{threads}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("a cell's figures")
}

struct Options {
    ids: Vec<u64>,
    threads: Vec<usize>,
    rounds: usize,
    decisions: u64,
    out: PathBuf,
}

fn list<T: std::str::FromStr>(flag: &str, value: &str) -> Vec<T> {
    value
        .split(',')
        .map(|v| {
            v.trim()
                .parse()
                .unwrap_or_else(|_| panic!("{flag}: {v:?} is not a positive count"))
        })
        .collect()
}

fn options(args: &[String]) -> Options {
    let mut options = Options {
        ids: vec![1, 1_000, 100_000, 1_000_000, 10_000_000],
        threads: vec![1, 2],
        rounds: 3,
        decisions: 4_000_000,
        out: PathBuf::from("target/memory-identities"),
    };
    let mut args = args.iter();
    while let Some(flag) = args.next() {
        let value = args
            .next()
            .unwrap_or_else(|| panic!("{flag} takes a value"));
        match flag.as_str() {
            "--ids" => options.ids = list(flag, value),
            "--threads" => options.threads = list(flag, value),
            "--rounds" => options.rounds = list(flag, value)[0],
            "--decisions" => options.decisions = list(flag, value)[0],
            "--out" => options.out = PathBuf::from(value),
            other => panic!(
                "unknown flag {other:?}: --ids N,.. --threads N,.. --rounds N --decisions N --out DIR"
            ),
        }
    }
    assert!(
        options.ids.iter().all(|&n| n > 0 && n % STRIDE != 0)
            && options.threads.iter().all(|&n| n > 0)
            && options.rounds > 0
            && options.decisions > 0,
        "counts must be positive (and identities prime to {STRIDE})"
    );
    options
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let [cell_flag, side, ids, threads, decisions] = args.as_slice()
        && cell_flag == "cell"
    {
        let number = |v: &String| v.parse::<u64>().expect("a count");
        let figures = cell(
            side,
            number(ids),
            number(threads) as usize,
            number(decisions),
        );
        println!("{}", serde_json::to_string(&figures).expect("json"));
        return;
    }
    let options = options(&args);
    let mut rows = Vec::new();
    for &threads in &options.threads {
        for &ids in &options.ids {
            eprintln!("  {ids} identities per thread, {threads} thread(s)");
            let (mut ours, mut theirs) = (Vec::new(), Vec::new());
            for round in 0..options.rounds {
                // Alternate which side goes first.
                if round % 2 == 0 {
                    ours.push(child("annotated", ids, threads, options.decisions));
                    theirs.push(child("governor", ids, threads, options.decisions));
                } else {
                    theirs.push(child("governor", ids, threads, options.decisions));
                    ours.push(child("annotated", ids, threads, options.decisions));
                }
            }
            let medians = |cells: &[Cell]| Cell {
                decisions_per_s: median(cells.iter().map(|c| c.decisions_per_s).collect()),
                bytes_per_identity: median(cells.iter().map(|c| c.bytes_per_identity).collect()),
            };
            rows.push(Row {
                ids_per_thread: ids,
                threads,
                annotated: medians(&ours),
                governor: medians(&theirs),
            });
        }
    }
    let table = table(&rows, &options);
    println!("{table}");
    std::fs::create_dir_all(&options.out).expect("--out");
    let write = |name: &str, text: String| {
        let path = options.out.join(name);
        std::fs::write(&path, text).expect("write");
        println!("wrote {}", path.display());
    };
    write("memory_identities.md", table);
    write("memory_identities.csv", csv(&rows));
    write(
        "memory_identities.json",
        serde_json::to_string_pretty(&rows).expect("json"),
    );
    let png = options.out.join("memory_identities.png");
    if load_font() {
        match plot(&rows, &png) {
            Ok(()) => println!("wrote {}", png.display()),
            Err(error) => eprintln!("could not draw {}: {error}", png.display()),
        }
    } else {
        eprintln!("no DejaVu Sans font for the plot; skipped it");
    }
}

/// Bytes per identity where it means something (from 100 000 identities
/// per thread).
fn bytes(row: &Row, cell: &Cell) -> String {
    if row.ids_per_thread >= 100_000 {
        format!("{:.1}", cell.bytes_per_identity)
    } else {
        "–".to_owned()
    }
}

fn table(rows: &[Row], options: &Options) -> String {
    let mut out = format!(
        "In memory, GCRA, `u64` identities, each thread its own; {} timed decisions per thread \
         after every identity was decided once; median of {} rounds, each cell a process of its own.\n\n\
         | threads | identities per thread | annotated fn decisions/s | `governor` | ratio \
         | annotated fn B per identity | `governor` | ratio |\n\
         |---:|---:|---:|---:|---:|---:|---:|---:|\n",
        options.decisions, options.rounds
    );
    for row in rows {
        let ratio_bytes = if row.ids_per_thread >= 100_000 {
            format!(
                "{:.2}×",
                row.annotated.bytes_per_identity / row.governor.bytes_per_identity
            )
        } else {
            "–".to_owned()
        };
        let _ = writeln!(
            out,
            "| {} | {} | {:.0} | {:.0} | {:.2}× | {} | {} | {} |",
            row.threads,
            row.ids_per_thread,
            row.annotated.decisions_per_s,
            row.governor.decisions_per_s,
            row.annotated.decisions_per_s / row.governor.decisions_per_s,
            bytes(row, &row.annotated),
            bytes(row, &row.governor),
            ratio_bytes
        );
    }
    out
}

fn csv(rows: &[Row]) -> String {
    let mut out = String::from(
        "threads,ids_per_thread,annotated_decisions_per_s,governor_decisions_per_s,\
         annotated_bytes_per_identity,governor_bytes_per_identity\n",
    );
    for row in rows {
        let _ = writeln!(
            out,
            "{},{},{:.0},{:.0},{:.2},{:.2}",
            row.threads,
            row.ids_per_thread,
            row.annotated.decisions_per_s,
            row.governor.decisions_per_s,
            row.annotated.bytes_per_identity,
            row.governor.bytes_per_identity
        );
    }
    out
}

/// Registers DejaVu Sans for the plot's text; `false` when none is found.
fn load_font() -> bool {
    [
        "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
        "/usr/share/fonts/dejavu/DejaVuSans.ttf",
        "/usr/share/fonts/TTF/DejaVuSans.ttf",
    ]
    .iter()
    .filter_map(|path| std::fs::read(path).ok())
    .any(|bytes| {
        let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
        plotters::style::register_font("sans-serif", FontStyle::Normal, bytes).is_ok()
    })
}

/// Decisions/s (left) and bytes per identity (right) against identities
/// per thread: ours solid, `governor` thin, one colour per thread count.
fn plot(rows: &[Row], path: &Path) -> Result<(), Box<dyn std::error::Error>> {
    let root = BitMapBackend::new(path, (1400, 600)).into_drawing_area();
    root.fill(&WHITE)?;
    let root = root.titled(
        "in memory, GCRA, u64 identities: the annotated fn (thick) and governor (thin)",
        ("sans-serif", 22),
    )?;
    let (left, right) = root.split_horizontally(700);
    let x_max = rows.iter().map(|r| r.ids_per_thread).max().unwrap_or(1) as f64 * 2.0;
    let x_max = x_max.max(2.0);
    let mut threads: Vec<usize> = rows.iter().map(|r| r.threads).collect();
    threads.dedup();
    let colors = [RGBColor(31, 119, 180), RGBColor(214, 39, 40)];
    type Pick = fn(&Cell) -> f64;
    let panels: [(&DrawingArea<BitMapBackend, _>, &str, Pick, u64); 2] = [
        (
            &left,
            "decisions / s (millions)",
            |c| c.decisions_per_s / 1e6,
            1,
        ),
        (
            &right,
            "bytes per live identity",
            |c| c.bytes_per_identity,
            100_000,
        ),
    ];
    for (area, label, pick, from) in panels {
        let shown: Vec<&Row> = rows.iter().filter(|r| r.ids_per_thread >= from).collect();
        let y_max = shown
            .iter()
            .flat_map(|r| [pick(&r.annotated), pick(&r.governor)])
            .fold(0.0, f64::max);
        let x_min = shown.iter().map(|r| r.ids_per_thread).min().unwrap_or(1) as f64 / 2.0;
        let mut chart = ChartBuilder::on(area)
            .margin(20)
            .x_label_area_size(45)
            .y_label_area_size(70)
            .build_cartesian_2d((x_min..x_max).log_scale(), 0f64..y_max * 1.15)?;
        chart
            .configure_mesh()
            .x_label_formatter(&|x| format!("{x:.0}"))
            .x_desc("identities per thread")
            .y_desc(label)
            .label_style(("sans-serif", 16))
            .draw()?;
        for (i, &t) in threads.iter().enumerate() {
            let color = colors[i % colors.len()];
            let line = |ours: bool| -> Vec<(f64, f64)> {
                shown
                    .iter()
                    .filter(|r| r.threads == t)
                    .map(|r| {
                        let cell = if ours { &r.annotated } else { &r.governor };
                        (r.ids_per_thread as f64, pick(cell))
                    })
                    .collect()
            };
            chart
                .draw_series(LineSeries::new(line(true), color.stroke_width(3)))?
                .label(format!("annotated fn, {t} thread(s)"))
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(3))
                });
            chart
                .draw_series(LineSeries::new(line(false), color.stroke_width(1)))?
                .label(format!("governor, {t} thread(s)"))
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(1))
                });
        }
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .label_font(("sans-serif", 14))
            .draw()?;
    }
    root.present()?;
    Ok(())
}
