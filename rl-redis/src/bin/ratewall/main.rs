//! `ratewall`: list, inspect and reset the rate limits of a running
//! deployment in its Redis, and edit its shared allow and deny lists.
//! Installed with `cargo install ratewall-redis --features cli`.
//!
//! ```text
//! ratewall --redis redis://127.0.0.1:6379/ --prefix sms limits
//! ratewall --redis redis://127.0.0.1:6379/ --prefix sms inspect sms_phone +8613800000000
//! ratewall --redis redis://127.0.0.1:6379/ --prefix sms reset sms_phone +8613800000000
//! ratewall --redis redis://127.0.0.1:6379/ --prefix app unblock login_user alice
//! ratewall --redis redis://127.0.0.1:6379/ --prefix sms deny +8613800000000 --name sms_phone --for 1h
//! ratewall --redis redis://127.0.0.1:6379/ --prefix sms lists
//! ratewall --redis redis://10.0.0.1:7000/,redis://10.0.0.2:7000/ --prefix sms limits
//! ratewall --redis redis+sentinel://10.0.0.1:26379,10.0.0.2:26379/mymaster --prefix sms limits
//! ```
//!
//! `--redis` (or `REDIS_URL`) is read with [`ratewall_redis::RedisUrl`]:
//! one server, node URLs separated by commas for Redis Cluster,
//! `redis+sentinel://...` for the master of a Sentinel deployment.
//! `--prefix` is the deployment's key prefix (default `ratewall`, the
//! limiter's default).
//!
//! The limits of each name come from the limits registry the limiter keeps
//! in Redis (`<prefix>:{limits}`, see [`ratewall_redis::RegisteredLimits`]): a name
//! is listed once a service has decided a call for it, and `inspect` and
//! `reset` use exactly the limits that service decides with. `inspect` peeks
//! through [`Requests::peek_identity`](ratewall::call::Requests::peek_identity) and never consumes; `reset` forgets the
//! identity's state for every limit of the name
//! ([`Requests::reset_identity`](ratewall::call::Requests::reset_identity); for a concurrency limit, that frees every
//! slot held for the identity) and lifts its blocks. A limit with a block
//! (`block_for`, [`Limit::with_block`](ratewall::Limit::with_block)) refuses an identity it refused for the
//! block's duration: `inspect` shows each block and its time left
//! (`BLOCKED`; JSON `"blocked_ms"` per limit and `"blocks"`), and `unblock`
//! lifts every block of the identity under the name, keeping its state
//! ([`Settings::unblock`](ratewall::settings::Settings::unblock)). For a concurrency limit (`max_in_flight`),
//! `inspect` shows the calls of the identity in flight now, over every
//! instance (`in flight now: 3 of 10`; JSON `"in_flight": 3`).
//!
//! Output is a table, or JSON with `--json`. Exit codes: 0 done, 1 Redis
//! failed (unreachable, timed out, not a Redis server, unexpected reply), 2
//! bad usage (arguments, URL, prefix), 3 not in the registry: an unknown
//! limit name, or no limit registered under the prefix (the message names
//! the prefixes that have a registry in that Redis, found with `SCAN`).

mod report;

use std::fmt::Write as _;
use std::io::Write as _;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::{Parser, Subcommand};
use ratewall::{Limiter, error::BackendError};
use ratewall_redis::{RedisBackend, RedisUrl, RegisteredLimits};

use report::{InspectReport, LimitsReport, ListsReport, Report, ResetReport, UnblockReport};

/// The command line of `ratewall`.
#[derive(Debug, Parser)]
#[command(
    name = "ratewall",
    version,
    about = "Inspect and reset rate limits in a running deployment's Redis",
    after_help = "IDENTITY is written as the service formats it (e.g. the normalised \
username, the phone number, the client IP).\n\nURL: redis://[[user]:password@]host[:port][/db] \
(rediss:// for TLS; valkey://, valkeys://, redis+unix:///path also work), several node URLs \
separated by commas for Redis Cluster, or \
redis+sentinel://[[user]:password@]host[:port][,host[:port]...]/MASTER_NAME[/db] for the master \
of a Sentinel deployment (the grammar of ratewall_redis::RedisUrl).\n\nExit codes: 0 done, \
1 Redis failed, 2 bad usage (arguments, URL, prefix), 3 not in the registry (unknown limit \
name, or nothing registered under the prefix)."
)]
pub struct Cli {
    /// Redis URL, e.g. redis://127.0.0.1:6379/; node URLs separated by commas
    /// select Redis Cluster, redis+sentinel://host:26379,host:26379/MASTER_NAME
    /// Redis Sentinel
    #[arg(long, env = "REDIS_URL", value_name = "URL", global = true)]
    pub redis: Option<String>,
    /// Replaced by the sentinel URL form of --redis (refused with how to write it)
    #[arg(long, value_name = "MASTER_NAME", global = true, hide = true)]
    pub sentinel: Option<String>,
    /// The deployment's key prefix (the limiter's `prefix`; its default is `ratewall`)
    #[arg(long, default_value = "ratewall", global = true)]
    pub prefix: String,
    /// Print JSON instead of a table
    #[arg(long, global = true)]
    pub json: bool,
    /// How long each Redis call (and connecting) may take, e.g. 500ms, 2s
    #[arg(long, default_value = "2s", value_parser = parse_timeout, global = true)]
    pub timeout: Duration,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// What `ratewall` does.
#[derive(Debug, Clone, Subcommand)]
pub enum Command {
    /// List the limit names in the registry and their limits
    Limits,
    /// Show limit, remaining and reset of each of NAME's limits for IDENTITY
    /// (never consumes)
    Inspect {
        /// The limit name, as `ratewall limits` lists it
        name: String,
        /// The identity, as the service formats it
        identity: String,
    },
    /// Forget IDENTITY's state for all of NAME's limits, and lift its blocks
    Reset {
        /// The limit name, as `ratewall limits` lists it
        name: String,
        /// The identity, as the service formats it
        identity: String,
    },
    /// Lift every block of IDENTITY under NAME (its state is kept)
    Unblock {
        /// The limit name, as `ratewall limits` lists it
        name: String,
        /// The identity, as the service formats it
        identity: String,
    },
    /// List the allow and deny entries every instance shares
    Lists,
    /// Let IDENTITY bypass NAME's limits (every limit without --name)
    Allow(ListChange),
    /// Refuse IDENTITY at once for NAME (every limit without --name)
    Deny(ListChange),
    /// Remove IDENTITY's allow or deny entry for NAME (the entry for every
    /// limit without --name)
    Unlist {
        /// The identity, as the service formats it
        identity: String,
        /// The limit name; every limit when left out
        #[arg(long)]
        name: Option<String>,
    },
}

/// The arguments of `allow` and `deny`.
#[derive(Debug, Clone, clap::Args)]
pub struct ListChange {
    /// The identity, as the service formats it
    pub identity: String,
    /// The limit name; every limit when left out
    #[arg(long)]
    pub name: Option<String>,
    /// How long the entry lasts, e.g. 30m, 1d; until removed when left out
    #[arg(long = "for", value_name = "DURATION", value_parser = parse_timeout)]
    pub duration: Option<Duration>,
}

fn parse_timeout(text: &str) -> Result<Duration, String> {
    match ratewall::clock::parse_duration(text) {
        Ok(timeout) if !timeout.is_zero() => Ok(timeout),
        Ok(_) => Err("the timeout must be above zero".to_owned()),
        Err(error) => Err(error.to_string()),
    }
}

/// Why `ratewall` failed; [`AdminError::exit_code`] tells the kinds apart.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AdminError {
    /// The arguments cannot work (exit code 2).
    #[error("{0}")]
    Usage(String),
    /// Redis could not be reached or failed (exit code 1).
    #[error("Redis at {target} failed while {doing}: {source}")]
    Redis {
        /// The server(s), passwords redacted.
        target: String,
        /// What was being done.
        doing: &'static str,
        /// The backend's error.
        source: BackendError,
    },
    /// The registry has no such name (exit code 3).
    #[error("{}", unknown_name(name, prefix, known, prefixes))]
    UnknownName {
        /// The name asked for.
        name: String,
        /// The prefix searched.
        prefix: String,
        /// The names the registry has.
        known: Vec<String>,
        /// When the registry is empty: the prefixes that have one.
        prefixes: Vec<String>,
    },
    /// Nothing is registered under the prefix (exit code 3).
    #[error("{}", empty_prefix(prefix, prefixes))]
    EmptyPrefix {
        /// The prefix searched.
        prefix: String,
        /// The prefixes that have a registry in this Redis.
        prefixes: Vec<String>,
    },
}

/// Why the registry of `prefix` is empty, and which prefixes have one.
fn empty_registry(prefix: &str, prefixes: &[String]) -> String {
    let key = RedisBackend::registry_key(prefix);
    let mut message = format!(
        "the registry `{key}` is empty (no service with this prefix decided a call in the last 7 days)"
    );
    if prefixes.is_empty() {
        message
            .push_str("; no prefix has a registry in this Redis (is it the deployment's Redis?)");
    } else {
        let _ = write!(
            message,
            "; prefixes with a registry in this Redis: {} (pass one with --prefix)",
            prefixes
                .iter()
                .map(|p| format!("`{p}`"))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    message
}

fn empty_prefix(prefix: &str, prefixes: &[String]) -> String {
    format!(
        "no limits registered under prefix `{prefix}`: {}",
        empty_registry(prefix, prefixes)
    )
}

fn unknown_name(name: &str, prefix: &str, known: &[String], prefixes: &[String]) -> String {
    let key = RedisBackend::registry_key(prefix);
    let mut message = format!("unknown limit name `{name}` under prefix `{prefix}`: ");
    if known.is_empty() {
        message.push_str(&empty_registry(prefix, prefixes));
    } else {
        let _ = write!(
            message,
            "the registry `{key}` has {} (see `ratewall limits`)",
            known
                .iter()
                .map(|n| format!("`{n}`"))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    message
}

impl AdminError {
    /// The process exit code: 1 Redis, 2 usage, 3 not in the registry
    /// (unknown name, empty prefix).
    pub fn exit_code(&self) -> u8 {
        match self {
            AdminError::Redis { .. } => 1,
            AdminError::Usage(_) => 2,
            AdminError::UnknownName { .. } | AdminError::EmptyPrefix { .. } => 3,
        }
    }
}

/// Reads `--redis` with [`ratewall_redis::RedisUrl`]; a refusal is bad usage (exit code 2)
/// and says what is wrong.
fn redis_url(text: &str) -> Result<RedisUrl, AdminError> {
    text.parse()
        .map_err(|error: ratewall_redis::RedisUrlError| AdminError::Usage(error.to_string()))
}

/// A connected backend, the limiter over it, and where it points.
struct Deployment {
    backend: Arc<RedisBackend>,
    limiter: Limiter,
    prefix: String,
    target: String,
}

impl Deployment {
    async fn connect(cli: &Cli) -> Result<Self, AdminError> {
        let Some(redis) = cli.redis.as_deref().filter(|r| !r.trim().is_empty()) else {
            return Err(AdminError::Usage(
                "no Redis given: pass --redis URL or set REDIS_URL".to_owned(),
            ));
        };
        let url = redis_url(redis)?;
        if let Some(master) = &cli.sentinel {
            return Err(AdminError::Usage(format!(
                "--sentinel is replaced by the sentinel URL form of --redis, the one the \
                 services read: --redis redis+sentinel://host:26379[,host:26379...]/{master}"
            )));
        }
        // Checks the prefix before connecting.
        Limiter::builder()
            .prefix(cli.prefix.as_str())
            .build()
            .map_err(|error| AdminError::Usage(error.to_string()))?;
        let target = url.to_string();
        let backend = url
            .builder()
            .timeout(cli.timeout)
            .connect_timeout(cli.timeout)
            .connect()
            .await
            .map_err(|source| AdminError::Redis {
                target: target.clone(),
                doing: "connecting",
                source,
            })?;
        let backend = Arc::new(backend);
        let limiter = Limiter::builder()
            .shared_backend(backend.clone())
            .prefix(cli.prefix.as_str())
            .build()
            .map_err(|error| AdminError::Usage(error.to_string()))?;
        Ok(Self {
            backend,
            limiter,
            prefix: cli.prefix.clone(),
            target,
        })
    }

    /// The prefixes with a registry in this Redis (for an empty one).
    async fn prefixes(&self) -> Result<Vec<String>, AdminError> {
        self.backend
            .registered_prefixes()
            .await
            .map_err(self.failed("scanning for limits registries"))
    }

    fn failed(&self, doing: &'static str) -> impl FnOnce(BackendError) -> AdminError + '_ {
        move |source| AdminError::Redis {
            target: self.target.clone(),
            doing,
            source,
        }
    }

    fn failed_limiter(
        &self,
        doing: &'static str,
    ) -> impl FnOnce(ratewall::Error) -> AdminError + '_ {
        move |error| match error {
            ratewall::Error::Backend(source) => (self.failed(doing))(source),
            other => AdminError::Usage(other.to_string()),
        }
    }

    async fn registered(&self, name: &str) -> Result<RegisteredLimits, AdminError> {
        let found = self
            .backend
            .registered(&self.prefix, name)
            .await
            .map_err(self.failed("reading the limits registry"))?;
        match found {
            Some(registered) => Ok(registered),
            None => {
                let known: Vec<String> = self
                    .backend
                    .registered_limits(&self.prefix)
                    .await
                    .map_err(self.failed("reading the limits registry"))?
                    .into_iter()
                    .map(|r| r.name)
                    .collect();
                let prefixes = if known.is_empty() {
                    self.prefixes().await?
                } else {
                    Vec::new()
                };
                Err(AdminError::UnknownName {
                    name: name.to_owned(),
                    prefix: self.prefix.clone(),
                    known,
                    prefixes,
                })
            }
        }
    }
}

/// The shared lists under the deployment's prefix, after `changed`.
async fn lists_report(
    deployment: &Deployment,
    changed: Option<String>,
) -> Result<Report, AdminError> {
    use ratewall::backend::Backend as _;
    let entries = deployment
        .backend
        .load_lists(&deployment.prefix, u64::MAX)
        .await
        .map_err(deployment.failed("reading the allow and deny lists"))?
        .map(|(_, entries)| entries)
        .unwrap_or_default();
    Ok(Report::Lists(ListsReport::new(
        &deployment.prefix,
        changed,
        &entries,
    )))
}

/// Runs one command against the deployment's Redis.
async fn run(cli: &Cli) -> Result<Report, AdminError> {
    let deployment = Deployment::connect(cli).await?;
    let scope = |name: &Option<String>| {
        name.as_deref()
            .map_or_else(|| "every limit".to_owned(), |n| format!("`{n}`"))
    };
    match &cli.command {
        Command::Lists => lists_report(&deployment, None).await,
        Command::Allow(change) | Command::Deny(change) => {
            let until = change.duration.map(|d| std::time::SystemTime::now() + d);
            let (list, result) = if matches!(cli.command, Command::Allow(_)) {
                let done = deployment
                    .limiter
                    .settings()
                    .allow(change.name.as_deref(), &change.identity, until)
                    .await;
                ("allow", done)
            } else {
                let done = deployment
                    .limiter
                    .settings()
                    .deny(change.name.as_deref(), &change.identity, until)
                    .await;
                ("deny", done)
            };
            result.map_err(deployment.failed_limiter("writing the allow and deny lists"))?;
            let changed = format!(
                "{list} `{}` for {}{}",
                change.identity,
                scope(&change.name),
                change
                    .duration
                    .map(|d| format!(" for {}s", d.as_secs()))
                    .unwrap_or_default()
            );
            lists_report(&deployment, Some(changed)).await
        }
        Command::Unlist { identity, name } => {
            deployment
                .limiter
                .settings()
                .unlist(name.as_deref(), identity)
                .await
                .map_err(deployment.failed_limiter("writing the allow and deny lists"))?;
            let changed = format!("unlisted `{identity}` for {}", scope(name));
            lists_report(&deployment, Some(changed)).await
        }
        Command::Limits => {
            let registered = deployment
                .backend
                .registered_limits(&deployment.prefix)
                .await
                .map_err(deployment.failed("reading the limits registry"))?;
            if registered.is_empty() {
                return Err(AdminError::EmptyPrefix {
                    prefix: deployment.prefix.clone(),
                    prefixes: deployment.prefixes().await?,
                });
            }
            Ok(Report::Limits(LimitsReport::new(
                &deployment.prefix,
                &registered,
            )))
        }
        Command::Inspect { name, identity } => {
            let registered = deployment.registered(name).await?;
            let decisions = deployment
                .limiter
                .requests()
                .peek_identity(name, identity, &registered.limits)
                .await
                .map_err(deployment.failed_limiter("peeking at the identity's state"))?;
            let key = deployment.limiter.key(name, identity);
            let blocks = deployment
                .limiter
                .settings()
                .blocked(name, identity)
                .await
                .map_err(deployment.failed_limiter("reading the identity's blocks"))?;
            let mut leases = Vec::with_capacity(registered.limits.len());
            for limit in &registered.limits {
                leases.push(match limit.lease() {
                    Some(_) => deployment
                        .backend
                        .leases(&key, limit)
                        .await
                        .map_err(deployment.failed("reading the lease records"))?,
                    None => Vec::new(),
                });
            }
            Ok(Report::Inspect(InspectReport::new(
                &deployment.prefix,
                &registered,
                identity,
                &key,
                &decisions,
                &leases,
                &blocks,
            )))
        }
        Command::Reset { name, identity } => {
            let registered = deployment.registered(name).await?;
            deployment
                .limiter
                .requests()
                .reset_identity(name, identity, &registered.limits)
                .await
                .map_err(deployment.failed_limiter("resetting the identity's state"))?;
            // A reset forgets everything: the blocks of limits the registry
            // no longer lists too.
            deployment
                .limiter
                .settings()
                .unblock(name, identity)
                .await
                .map_err(deployment.failed_limiter("lifting the identity's blocks"))?;
            let key = deployment.limiter.key(name, identity);
            Ok(Report::Reset(ResetReport::new(
                &deployment.prefix,
                &registered,
                identity,
                &key,
            )))
        }
        Command::Unblock { name, identity } => {
            deployment.registered(name).await?;
            let settings = deployment.limiter.settings();
            let blocks = settings
                .blocked(name, identity)
                .await
                .map_err(deployment.failed_limiter("reading the identity's blocks"))?;
            let lifted = settings
                .unblock(name, identity)
                .await
                .map_err(deployment.failed_limiter("lifting the identity's blocks"))?;
            let key = deployment.limiter.key(name, identity);
            Ok(Report::Unblock(UnblockReport::new(
                &deployment.prefix,
                name,
                identity,
                &key,
                lifted,
                &blocks,
            )))
        }
    }
}

/// Parses the command line (exit code 2 on bad usage), runs the command,
/// prints the report or the error.
fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("ratewall: cannot start the async runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(&cli)) {
        Ok(report) => {
            let text = if cli.json {
                report.to_json()
            } else {
                report.to_table()
            };
            // A closed stdout (e.g. `| head`) is not worth a panic.
            let mut stdout = std::io::stdout().lock();
            let _ = stdout
                .write_all(text.as_bytes())
                .and_then(|()| stdout.flush());
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("ratewall: {error}");
            ExitCode::from(error.exit_code())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_command_line_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn options_go_before_or_after_the_command() {
        let cli = Cli::try_parse_from([
            "ratewall",
            "inspect",
            "sms",
            "+331",
            "--json",
            "--prefix",
            "app",
            "--redis",
            "redis://x/",
        ])
        .unwrap();
        assert!(cli.json);
        assert_eq!(cli.prefix, "app");
        assert!(matches!(cli.command, Command::Inspect { ref name, .. } if name == "sms"));
        let cli = Cli::try_parse_from(["ratewall", "unblock", "login", "alice"]).unwrap();
        assert!(
            matches!(cli.command, Command::Unblock { ref name, ref identity } if name == "login" && identity == "alice")
        );
    }

    #[test]
    fn timeouts_need_a_unit_or_seconds_and_must_be_positive() {
        assert_eq!(parse_timeout("500ms"), Ok(Duration::from_millis(500)));
        assert!(parse_timeout("0s").is_err());
        assert!(parse_timeout("soon").is_err());
    }
}
