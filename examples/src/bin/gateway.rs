//! The API gateway showcase: see `rl_examples::gateway`.

#[tokio::main]
async fn main() -> std::process::ExitCode {
    rl_examples::exit_code("gateway", rl_examples::gateway::main().await)
}
