//! The API gateway showcase: see `ratewall_examples::gateway`.

#[tokio::main]
async fn main() -> std::process::ExitCode {
    ratewall_examples::exit_code("gateway", ratewall_examples::gateway::main().await)
}
