//! `--compare-coalesce`: the same load decided by calls alone and by a
//! backend that coalesces them (`RedisBackendBuilder::coalesce`), in one
//! run: at each concurrency, `--cpu-runs` rounds of a cell alone then a
//! cell coalesced, each on its own backend (one multiplexed connection),
//! so both see the same server and machine at nearly the same moments.
//! Per cell: decisions/s, p50 and p99, and the server's CPU per decision
//! (`INFO commandstats`: a coalesced call carries many). Prints the
//! medians and the ratios coalesced ÷ alone, and writes `coalesce.md`,
//! `coalesce.csv`, `coalesce.json` and `coalesce.png` under `--out`.

use super::*;

/// One algorithm at one concurrency: the medians of each side's cells.
#[derive(Debug, Clone, Serialize)]
struct Pair {
    algorithm: &'static str,
    concurrency: usize,
    alone: Side,
    coalesced: Side,
    /// The coalescing backend's counts over its cells at this concurrency:
    /// calls sent alone, coalesced calls and the calls they carried.
    calls_alone: u64,
    batches: u64,
    batched: u64,
}

/// The medians of one side's cells.
#[derive(Debug, Clone, Copy, Serialize)]
struct Side {
    decisions_per_s: f64,
    p50_ms: f64,
    p99_ms: f64,
    server_us_per_decision: Option<f64>,
    /// The server process's CPU per decision (`INFO cpu`), I/O included.
    server_process_us_per_decision: Option<f64>,
    errors: u64,
}

impl Side {
    fn of(cells: &[Cell]) -> Self {
        let pick = |f: fn(&Cell) -> f64| median(&cells.iter().map(f).collect::<Vec<_>>());
        let some_median = |f: fn(&Cell) -> Option<f64>| {
            let values: Vec<f64> = cells.iter().filter_map(f).collect();
            (!values.is_empty()).then(|| median(&values))
        };
        Side {
            decisions_per_s: pick(|c| c.decisions_per_s),
            p50_ms: pick(|c| c.p50_ms),
            p99_ms: pick(|c| c.p99_ms),
            server_us_per_decision: some_median(|c| c.server_us_per_decision),
            server_process_us_per_decision: some_median(|c| c.server_process_us_per_decision),
            errors: cells.iter().map(|c| c.errors).sum(),
        }
    }
}

#[derive(Debug, Serialize)]
struct Comparison {
    url: String,
    secs_per_cell: f64,
    rounds: usize,
    coalesce_max: usize,
    coalesce_in_flight: usize,
    identities: u64,
    limit: &'static str,
    pairs: Vec<Pair>,
}

async fn backend(options: &Options, coalesce: bool) -> Arc<RedisBackend> {
    Arc::new(
        builder(options.url.as_str())
            .timeout(Duration::from_secs(5))
            .call_mode(options.mode)
            .coalesce(coalesce)
            .coalesce_max(options.coalesce_max)
            .coalesce_in_flight(options.coalesce_in_flight)
            .connect()
            .await
            .unwrap_or_else(|error| panic!("cannot connect to {}: {error}", options.url)),
    )
}

/// Runs the comparison (see the module docs).
pub(crate) async fn compare(options: &Options) {
    let alone = backend(options, false).await;
    let coalescing = backend(options, true).await;
    assert!(coalescing.coalesces(), "this backend does not coalesce");
    let length = Duration::from_secs_f64(options.secs);
    let mut pairs = Vec::new();
    for &algorithm in &options.algorithms {
        for &callers in &options.concurrency {
            eprintln!("  {algorithm} at {callers} callers");
            let before = coalescing.coalesced().unwrap_or_default();
            let (mut lone, mut together) = (Vec::new(), Vec::new());
            for _ in 0..options.cpu_runs {
                lone.push(
                    run(
                        &options.url,
                        &alone,
                        algorithm,
                        Shape::Single,
                        callers,
                        length,
                    )
                    .await,
                );
                together.push(
                    run(
                        &options.url,
                        &coalescing,
                        algorithm,
                        Shape::Single,
                        callers,
                        length,
                    )
                    .await,
                );
            }
            let after = coalescing.coalesced().unwrap_or_default();
            pairs.push(Pair {
                algorithm: algorithm.name(),
                concurrency: callers,
                alone: Side::of(&lone),
                coalesced: Side::of(&together),
                calls_alone: after.alone - before.alone,
                batches: after.batches - before.batches,
                batched: after.batched - before.batched,
            });
        }
    }
    let report = Comparison {
        url: ratewall_redis::redact_url(&options.url),
        secs_per_cell: options.secs,
        rounds: options.cpu_runs,
        coalesce_max: options.coalesce_max,
        coalesce_in_flight: options.coalesce_in_flight,
        identities: IDENTITIES,
        limit: "100 per minute",
        pairs,
    };
    let table = table(&report);
    println!("{table}");
    std::fs::create_dir_all(&options.out).expect("create --out dir");
    let write = |name: &str, text: &str| {
        let path = options.out.join(name);
        std::fs::write(&path, text).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
        println!("wrote {}", path.display());
    };
    write("coalesce.md", &table);
    write("coalesce.csv", &csv(&report));
    write(
        "coalesce.json",
        &serde_json::to_string_pretty(&report).expect("serialise"),
    );
    let png = options.out.join("coalesce.png");
    if load_font(options) {
        match plot(&report, &png) {
            Ok(()) => println!("wrote {}", png.display()),
            Err(error) => eprintln!("could not draw {}: {error}", png.display()),
        }
    } else {
        eprintln!("no font for the plot (give one with --font PATH.ttf); skipped it");
    }
}

fn ratio(a: Option<f64>, b: Option<f64>) -> String {
    match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => format!("{:.2}×", a / b),
        _ => "–".to_owned(),
    }
}

fn table(report: &Comparison) -> String {
    let mut out = format!(
        "Calls alone against coalesced (at most {} in one, {} in flight), {} s per cell, median of {} \
         alternating rounds, {} identities, {}; script µs per decision from INFO commandstats (the \
         scripts' own time), server process µs per decision from INFO cpu (all of the server's work, \
         reading, parsing and answering commands included).\n\n\
         | algorithm | callers | decisions/s alone | coalesced | ratio | script µs/decision alone \
         | coalesced | ratio | server process µs/decision alone | coalesced | ratio \
         | p50 ms alone | coalesced | ratio | p99 ms alone | coalesced \
         | decisions per coalesced call |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
        report.coalesce_max,
        report.coalesce_in_flight,
        report.secs_per_cell,
        report.rounds,
        report.identities,
        report.limit
    );
    for p in &report.pairs {
        let per_batch = if p.batches > 0 {
            format!("{:.1}", p.batched as f64 / p.batches as f64)
        } else {
            "–".to_owned()
        };
        let _ = writeln!(
            out,
            "| {} | {} | {:.0} | {:.0} | {} | {} | {} | {} | {} | {} | {} | {:.3} | {:.3} | {} | {:.3} | {:.3} | {} |",
            p.algorithm,
            p.concurrency,
            p.alone.decisions_per_s,
            p.coalesced.decisions_per_s,
            ratio(
                Some(p.coalesced.decisions_per_s),
                Some(p.alone.decisions_per_s)
            ),
            opt(p.alone.server_us_per_decision, 2),
            opt(p.coalesced.server_us_per_decision, 2),
            ratio(
                p.coalesced.server_us_per_decision,
                p.alone.server_us_per_decision
            ),
            opt(p.alone.server_process_us_per_decision, 2),
            opt(p.coalesced.server_process_us_per_decision, 2),
            ratio(
                p.coalesced.server_process_us_per_decision,
                p.alone.server_process_us_per_decision
            ),
            p.alone.p50_ms,
            p.coalesced.p50_ms,
            ratio(Some(p.coalesced.p50_ms), Some(p.alone.p50_ms)),
            p.alone.p99_ms,
            p.coalesced.p99_ms,
            per_batch
        );
    }
    out
}

fn csv(report: &Comparison) -> String {
    let mut out = String::from(
        "algorithm,callers,alone_decisions_per_s,coalesced_decisions_per_s,\
         alone_server_us_per_decision,coalesced_server_us_per_decision,\
         alone_server_process_us_per_decision,coalesced_server_process_us_per_decision,\
         alone_p50_ms,coalesced_p50_ms,alone_p99_ms,coalesced_p99_ms,batches,batched\n",
    );
    for p in &report.pairs {
        let _ = writeln!(
            out,
            "{},{},{:.0},{:.0},{},{},{},{},{:.3},{:.3},{:.3},{:.3},{},{}",
            p.algorithm,
            p.concurrency,
            p.alone.decisions_per_s,
            p.coalesced.decisions_per_s,
            opt(p.alone.server_us_per_decision, 3),
            opt(p.coalesced.server_us_per_decision, 3),
            opt(p.alone.server_process_us_per_decision, 3),
            opt(p.coalesced.server_process_us_per_decision, 3),
            p.alone.p50_ms,
            p.coalesced.p50_ms,
            p.alone.p99_ms,
            p.coalesced.p99_ms,
            p.batches,
            p.batched
        );
    }
    out
}

/// Decisions/s and the server process's µs per decision against callers: per algorithm,
/// a solid line coalesced and a thin one alone.
fn plot(report: &Comparison, path: &Path) -> Result<(), Box<dyn std::error::Error>> {
    let root = BitMapBackend::new(path, (1400, 600)).into_drawing_area();
    root.fill(&WHITE)?;
    let root = root.titled(
        &format!(
            "ratewall-redis, one connection: calls alone (thin) and coalesced (thick), {} s per point, median of {}",
            report.secs_per_cell, report.rounds
        ),
        ("sans-serif", 22),
    )?;
    let (left, right) = root.split_horizontally(700);
    let mut concurrency: Vec<f64> = report.pairs.iter().map(|p| p.concurrency as f64).collect();
    concurrency.dedup();
    let x_max = concurrency.iter().copied().fold(1.0, f64::max) * 1.5;
    let colors = COLORS;
    let mut algorithms: Vec<&str> = report.pairs.iter().map(|p| p.algorithm).collect();
    algorithms.dedup();
    type Pick = fn(&Side) -> Option<f64>;
    let panels: [(&DrawingArea<BitMapBackend, _>, &str, Pick, bool); 2] = [
        (
            &left,
            "decisions / s",
            |s: &Side| Some(s.decisions_per_s),
            true,
        ),
        (
            &right,
            "server process µs per decision (INFO cpu)",
            |s: &Side| s.server_process_us_per_decision,
            false,
        ),
    ];
    for (area, label, pick, thousands) in panels {
        let y_max = report
            .pairs
            .iter()
            .flat_map(|p| [pick(&p.alone), pick(&p.coalesced)])
            .flatten()
            .fold(0.0, f64::max);
        let mut chart = ChartBuilder::on(area)
            .margin(20)
            .x_label_area_size(45)
            .y_label_area_size(80)
            .build_cartesian_2d(
                (0.8f64..x_max)
                    .log_scale()
                    .with_key_points(concurrency.clone()),
                0f64..y_max * 1.1,
            )?;
        chart
            .configure_mesh()
            .x_desc("concurrent callers")
            .y_desc(label)
            .x_label_formatter(&|x| format!("{x:.0}"))
            .y_label_formatter(&|y| {
                if thousands {
                    format!("{:.0}k", y / 1_000.0)
                } else {
                    format!("{y:.1}")
                }
            })
            .label_style(("sans-serif", 16))
            .axis_desc_style(("sans-serif", 18))
            .draw()?;
        for (i, algorithm) in algorithms.iter().enumerate() {
            let color = colors[i % colors.len()];
            for (coalesced, width) in [(false, 1), (true, 3)] {
                let points: Vec<(f64, f64)> = report
                    .pairs
                    .iter()
                    .filter(|p| p.algorithm == *algorithm)
                    .filter_map(|p| {
                        let side = if coalesced { &p.coalesced } else { &p.alone };
                        pick(side).map(|y| (p.concurrency as f64, y))
                    })
                    .collect();
                let name = format!(
                    "{algorithm} {}",
                    if coalesced { "coalesced" } else { "alone" }
                );
                chart
                    .draw_series(LineSeries::new(points.clone(), color.stroke_width(width)))?
                    .label(name)
                    .legend(move |(x, y)| {
                        PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(width))
                    });
                chart.draw_series(
                    points
                        .iter()
                        .map(|&(x, y)| Circle::new((x, y), 3, color.filled())),
                )?;
            }
        }
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .label_font(("sans-serif", 16))
            .position(if thousands {
                SeriesLabelPosition::UpperLeft
            } else {
                SeriesLabelPosition::UpperRight
            })
            .draw()?;
    }
    root.present()?;
    Ok(())
}
