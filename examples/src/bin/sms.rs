//! The SMS anti-abuse service: see `rl_examples::sms`.

#[tokio::main]
async fn main() -> std::process::ExitCode {
    rl_examples::exit_code("sms", rl_examples::sms::main().await)
}
