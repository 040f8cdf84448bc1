//! Limits from an application's own configuration: config-rs layers a YAML
//! file and environment variables, the `ratewall` section is read as a
//! [`LimitsFile`] (ratewall's feature `serde`), applied to a limiter, and
//! checked: every name has the limits, policy and shadow mode loaded, and a
//! burst of calls on `sms_phone` is refused where its limits say.
//!
//! ```text
//! cargo run -p ratewall-examples --bin limits-from-config                 # the YAML below
//! cargo run -p ratewall-examples --bin limits-from-config -- app.yaml     # a file of yours
//! APP__RATEWALL__LIMITS__SMS_PHONE__RATES=3/1m,20/1h \
//!   APP__RATEWALL__LIMITS__LOGIN_IP__SHADOW=false \
//!   cargo run -p ratewall-examples --bin limits-from-config                # overridden
//! ```
//!
//! Environment variables: `APP__` then the path, `__` between its parts
//! (config-rs lowercases them: `APP__RATEWALL__LIMITS__SMS_PHONE__RATES` is
//! `ratewall.limits.sms_phone.rates`); values are parsed (`true`, `42`),
//! and a name's `rates` and the `allow`/`deny` lists are split at commas.
//! A bad value is refused with the limit named, and nothing is applied.

use config::{Config, Environment, File, FileFormat};
use ratewall::config::LimitsFile;
use ratewall::{CallSpec, FailurePolicy, GroupSpec, Limit, Limiter};
use ratewall_examples::StartupError;

/// The configuration when no file is given: a service's own settings and
/// its limits under `ratewall`.
const YAML: &str = r#"
service:
  port: 8080
ratewall:
  limits:
    sms_phone:
      rates: ["1/1m", "5/1h", "10/1d"]
      algorithm: sliding_log
      on_error: "local:4"
    "api@pro":
      rates:
        - 1000/1m
        - { rate: 20/1s, algorithm: sliding_window, slots: 20 }
        - { max_in_flight: 10, in_flight_ttl: 30s }
    login_ip:
      rates: ["100 per day"]
      shadow: true
  lists:
    deny: ["203.0.113.9"]
    sms_phone:
      allow: ["+15550100"]
"#;

#[tokio::main(flavor = "current_thread")]
async fn main() -> std::process::ExitCode {
    ratewall_examples::exit_code("limits-from-config", run().await)
}

async fn run() -> Result<(), StartupError> {
    let limits = match std::env::args().nth(1) {
        Some(path) => load(File::with_name(&path))?,
        None => load(File::from_str(YAML, FileFormat::Yaml))?,
    };
    let limiter = Limiter::builder()
        .memory()
        .build()
        .map_err(|e| StartupError::new(e.to_string()))?;
    limits
        .apply(&limiter)
        .map_err(|e| StartupError::new(format!("applying the limits: {e}")))?;

    for (name, entry) in limits.iter() {
        let written: Vec<String> = entry.limits().iter().map(Limit::to_string).collect();
        let policy = match entry.policy() {
            Some(FailurePolicy::Local { share }) => format!(", on_error local:{share}"),
            Some(policy) => format!(", on_error {}", policy.name()),
            None => String::new(),
        };
        let shadow = if entry.shadow() { ", shadow" } else { "" };
        println!("{name}: {}{policy}{shadow}", written.join(", "));
        // What was loaded is what the limiter decides with.
        let settings = limiter.settings();
        assert_eq!(settings.limits(name).as_deref(), Some(entry.limits()));
        assert_eq!(
            settings.policy_for(name, None),
            entry.policy().unwrap_or_default()
        );
        assert_eq!(settings.of(name).shadow, entry.shadow());
    }
    for entry in limits.lists() {
        let name = entry.name.as_deref().unwrap_or("every limit");
        println!("{} {} for {name}", entry.kind, entry.identity);
    }
    assert_eq!(
        limiter.settings().list_entries().len(),
        limits.lists().len()
    );

    if let Some(sms) = limits.get("sms_phone")
        && !sms.shadow()
    {
        // A burst on one phone: all-or-nothing over its limits, so as many
        // calls pass at once as the smallest capacity allows.
        let capacity = sms.limits().iter().map(Limit::capacity).min().unwrap_or(0);
        let spec = CallSpec::owned(
            "send_sms",
            vec![GroupSpec::owned(
                "sms_phone",
                vec![Limit::per_second(1_000).unwrap()],
            )],
        );
        let mut admitted = Vec::new();
        while let Ok(permit) = limiter.call(&spec, &[&"+33612345678"]).await {
            admitted.push(permit);
            assert!(
                admitted.len() as u64 <= capacity,
                "more than {capacity} admitted"
            );
        }
        assert_eq!(admitted.len() as u64, capacity);
        println!("sms_phone: {capacity} admitted at once on +33612345678, the next refused");
        // On its allow list: never limited.
        for _ in 0..=capacity {
            let _permit = limiter
                .call(&spec, &[&"+15550100"])
                .await
                .map_err(|e| StartupError::new(format!("an allowed phone was refused: {e}")))?;
        }
    }
    Ok(())
}

/// The `ratewall` section of `file` with the environment over it, read as
/// a limits file: config-rs' error when it is not one, naming the limit.
fn load<S>(file: S) -> Result<LimitsFile, StartupError>
where
    S: config::Source + Clone + Send + Sync + 'static,
{
    let unreadable = |e: config::ConfigError| StartupError::new(format!("configuration: {e}"));
    // The names the file sets: their `rates` (and lists) are lists in the
    // environment, comma-separated.
    let from_file = Config::builder()
        .add_source(file.clone())
        .build()
        .map_err(unreadable)?;
    let names: Vec<String> = from_file
        .get_table("ratewall.limits")
        .map(|limits| limits.into_keys().collect())
        .unwrap_or_default();
    let mut environment = Environment::with_prefix("APP")
        .separator("__")
        .try_parsing(true)
        .list_separator(",")
        .with_list_parse_key("ratewall.lists.allow")
        .with_list_parse_key("ratewall.lists.deny");
    for name in &names {
        environment = environment
            .with_list_parse_key(&format!("ratewall.limits.{name}.rates"))
            .with_list_parse_key(&format!("ratewall.lists.{name}.allow"))
            .with_list_parse_key(&format!("ratewall.lists.{name}.deny"));
    }
    let config = Config::builder()
        .add_source(file)
        .add_source(environment)
        .build()
        .map_err(unreadable)?;
    config.get::<LimitsFile>("ratewall").map_err(unreadable)
}
