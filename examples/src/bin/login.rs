//! The login-failure protection service: see `ratewall_examples::login`.

#[tokio::main]
async fn main() -> std::process::ExitCode {
    ratewall_examples::exit_code("login", ratewall_examples::login::main().await)
}
