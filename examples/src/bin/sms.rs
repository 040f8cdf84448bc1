//! The SMS anti-abuse service: see `rl_examples::sms`.

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    rl_examples::sms::main().await
}
