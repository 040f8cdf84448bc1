//! The login-failure protection service: see `rl_examples::login`.

#[tokio::main]
async fn main() -> std::process::ExitCode {
    rl_examples::exit_code("login", rl_examples::login::main().await)
}
