//! The SMS anti-abuse service: see `ratewall_examples::sms`.

#[tokio::main]
async fn main() -> std::process::ExitCode {
    ratewall_examples::exit_code("sms", ratewall_examples::sms::main().await)
}
