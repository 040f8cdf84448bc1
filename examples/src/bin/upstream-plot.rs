//! Draws what the mock upstream of the `upstream` showcase did, second by
//! second (a history `upstream-trial` wrote, the file `HISTORY`, or the
//! upstream's `GET /history` at `UPSTREAM`, default
//! `http://127.0.0.1:3004`): requests served per second (averaged over its
//! window, `WINDOW_MS`, default 10 000) against its limit, and its `429`s.
//! `TITLE` says what ran. Writes `OUT` (default `docs/upstream.png`); the
//! text needs a TTF (`FONT`, default DejaVu Sans).

use plotters::prelude::*;
use plotters::style::FontStyle;
use ratewall_examples::StartupError;
use ratewall_examples::upstream::Second;

const FONTS: [&str; 3] = [
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
];

fn load_font() -> Result<(), StartupError> {
    let candidates: Vec<String> = match std::env::var("FONT") {
        Ok(path) => vec![path],
        Err(_) => FONTS.iter().map(|f| (*f).to_owned()).collect(),
    };
    for path in &candidates {
        if let Ok(bytes) = std::fs::read(path) {
            let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
            if plotters::style::register_font("sans-serif", FontStyle::Normal, bytes).is_ok() {
                return Ok(());
            }
        }
    }
    Err(StartupError::new(format!(
        "no font for the plot's text: set FONT to a TTF (tried {})",
        candidates.join(", ")
    )))
}

/// Every second from the first to the last, the quiet ones as zeros (the
/// upstream keeps only the seconds it answered in).
fn every_second(history: &[Second]) -> Vec<Second> {
    let (Some(first), Some(last)) = (history.first(), history.last()) else {
        return Vec::new();
    };
    let (mut tpm, mut rpm) = (first.tpm, first.rpm);
    (first.second..=last.second)
        .map(|second| match history.iter().find(|s| s.second == second) {
            Some(s) => {
                (tpm, rpm) = (s.tpm, s.rpm);
                *s
            }
            None => Second {
                second,
                tpm,
                rpm,
                ..Second::default()
            },
        })
        .collect()
}

fn draw(
    history: &[Second],
    out: &str,
    title: &str,
    window: u64,
) -> Result<(), Box<dyn std::error::Error>> {
    let history = &every_second(history)[..];
    let start = history.first().map_or(0, |s| s.second);
    let end = history.last().map_or(1, |s| s.second) + 1;
    let x = |s: &Second| (s.second - start) as f64;
    // Requests per second, averaged over the upstream's window, and the
    // limit as a rate.
    let smoothed: Vec<(f64, f64)> = history
        .iter()
        .map(|s| {
            let near: u64 = history
                .iter()
                .filter(|o| o.second + window > s.second && o.second <= s.second)
                .map(|o| o.requests)
                .sum();
            (x(s), near as f64 / window as f64)
        })
        .collect();
    let limit: Vec<(f64, f64)> = history
        .iter()
        .map(|s| (x(s), s.rpm as f64 / window as f64))
        .collect();
    let y_max = smoothed
        .iter()
        .map(|p| p.1)
        .fold(1.0, f64::max)
        .max(limit.iter().map(|p| p.1).fold(1.0, f64::max))
        * 1.2;
    let root = BitMapBackend::new(out, (1200, 700)).into_drawing_area();
    root.fill(&WHITE)?;
    let (heading, rest) = root.split_vertically(40);
    heading.draw(&Text::new(
        title.to_owned(),
        (10, 10),
        ("sans-serif", 22).into_font(),
    ))?;
    let (top, bottom) = rest.split_vertically(420);
    let mut chart = ChartBuilder::on(&top)
        .caption(
            format!(
                "requests served per second ({window} s average) against the upstream's limit per second"
            ),
            ("sans-serif", 18),
        )
        .margin(10)
        .x_label_area_size(30)
        .y_label_area_size(60)
        .build_cartesian_2d(0.0..(end - start) as f64, 0.0..y_max)?;
    chart
        .configure_mesh()
        .x_desc("s")
        .y_desc("requests / s")
        .draw()?;
    chart
        .draw_series(LineSeries::new(smoothed, BLUE.stroke_width(2)))?
        .label("served")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLUE));
    chart
        .draw_series(LineSeries::new(limit, RED.stroke_width(1)))?
        .label("limit")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], RED));
    chart.configure_series_labels().border_style(BLACK).draw()?;
    let refused_max = history.iter().map(|s| s.refused).max().unwrap_or(0).max(1) as f64 * 1.2;
    let mut chart = ChartBuilder::on(&bottom)
        .caption(
            "requests refused by the upstream (429) per second",
            ("sans-serif", 18),
        )
        .margin(10)
        .x_label_area_size(30)
        .y_label_area_size(60)
        .build_cartesian_2d(0.0..(end - start) as f64, 0.0..refused_max)?;
    chart.configure_mesh().x_desc("s").y_desc("429s").draw()?;
    chart.draw_series(
        history
            .iter()
            .filter(|s| s.refused > 0)
            .map(|s| Rectangle::new([(x(s), 0.0), (x(s) + 0.8, s.refused as f64)], RED.filled())),
    )?;
    root.present()?;
    Ok(())
}

async fn run() -> Result<(), StartupError> {
    let out = std::env::var("OUT").unwrap_or_else(|_| "docs/upstream.png".to_owned());
    let title = std::env::var("TITLE").unwrap_or_else(|_| {
        "ratewall: four workers sharing one budget in Redis against a strict upstream".to_owned()
    });
    let window = ratewall_examples::upstream::env_number("WINDOW_MS", 10_000)?
        .div_ceil(1_000)
        .max(1);
    let history: Vec<Second> = match std::env::var("HISTORY") {
        Ok(path) => {
            let text = std::fs::read_to_string(&path)
                .map_err(|e| StartupError::new(format!("cannot read {path}: {e}")))?;
            serde_json::from_str(&text)
                .map_err(|e| StartupError::new(format!("unreadable history in {path}: {e}")))?
        }
        Err(_) => {
            let url =
                std::env::var("UPSTREAM").unwrap_or_else(|_| "http://127.0.0.1:3004".to_owned());
            reqwest::get(format!("{url}/history"))
                .await
                .and_then(|r| r.error_for_status())
                .map_err(|e| StartupError::new(format!("cannot read {url}/history: {e}")))?
                .json()
                .await
                .map_err(|e| StartupError::new(format!("unreadable history from {url}: {e}")))?
        }
    };
    if history.is_empty() {
        return Err(StartupError::new(
            "an empty history: nothing to draw".to_owned(),
        ));
    }
    load_font()?;
    draw(&history, &out, &title, window)
        .map_err(|e| StartupError::new(format!("cannot draw {out}: {e}")))?;
    println!("{out}: drawn from {} seconds with answers", history.len());
    Ok(())
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    ratewall_examples::exit_code("upstream-plot", run().await)
}
