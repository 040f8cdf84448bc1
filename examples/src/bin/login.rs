//! The login-failure protection service: see `rl_examples::login`.

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    rl_examples::login::main().await
}
