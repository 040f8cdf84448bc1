//! Locating the `redis-server` executable.

use std::env;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// The name of the executable the harness runs (also in sentinel mode).
pub const REDIS_SERVER: &str = "redis-server";

/// The message of the panic raised when `redis-server` cannot be found.
pub const NOT_FOUND_MESSAGE: &str = "redis-server not found: install it with \
    `apt-get install -y redis-server` (Debian) or run the README test command, \
    which installs it";

/// Directories searched after `PATH`.
const FALLBACK_DIRS: [&str; 2] = ["/usr/bin", "/usr/local/bin"];

/// Returns the path of `redis-server`, searching `PATH` first and then
/// `/usr/bin` and `/usr/local/bin`. The result is cached for the process.
///
/// # Panics
///
/// Panics with [`NOT_FOUND_MESSAGE`] if the executable is not found. Tests
/// that need Redis are never skipped silently.
pub fn redis_server_path() -> PathBuf {
    static PATH: OnceLock<Option<PathBuf>> = OnceLock::new();
    PATH.get_or_init(find_redis_server)
        .clone()
        .unwrap_or_else(|| panic!("{NOT_FOUND_MESSAGE}"))
}

/// Searches for `redis-server` without panicking.
pub fn find_redis_server() -> Option<PathBuf> {
    let from_path = env::var_os("PATH")
        .map(|paths| env::split_paths(&paths).collect::<Vec<_>>())
        .unwrap_or_default();
    from_path
        .into_iter()
        .chain(FALLBACK_DIRS.iter().map(PathBuf::from))
        .map(|dir| dir.join(REDIS_SERVER))
        .find(|candidate| is_executable(candidate))
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    path.metadata()
        .map(|meta| meta.is_file() && meta.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}
