//! Spawning `redis-server` child processes, waiting for them to become ready
//! and sending them signals. Shared by [`RedisServer`](super::RedisServer),
//! the cluster and the sentinel helpers.

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use redis::{FromRedisValue, RedisResult};

/// Name of the log file (stdout + stderr of the server) inside its temp dir.
pub(crate) const LOG_FILE: &str = "redis.log";

/// How long a started server may take to answer before the harness gives up.
pub(crate) const READY_TIMEOUT: Duration = Duration::from_secs(10);

/// How long `stop()` waits after SIGTERM before sending SIGKILL.
pub(crate) const STOP_GRACE: Duration = Duration::from_secs(2);

/// Marker written to the log before every start attempt; log tails shown in
/// panic messages only contain what follows the last marker.
const ATTEMPT_MARKER: &str = "=== ratewall-tests harness: starting";

/// Number of log lines included in panic messages.
const TAIL_LINES: usize = 40;

/// Why a start attempt failed.
#[derive(Debug)]
pub(crate) enum StartError {
    /// The port (or cluster bus port) was taken: retrying with another port
    /// is worthwhile.
    AddressInUse(String),
    /// Anything else: retrying would not help.
    Fatal(String),
}

/// Spawns `binary args...` in `dir` with stdout/stderr appended to the log
/// file, then waits until the server on `port` answers `INFO server` with the
/// child's own pid (so an unrelated server that grabbed the port is never
/// mistaken for ours).
pub(crate) fn spawn_and_wait(
    binary: &Path,
    dir: &Path,
    args: &[String],
    port: u16,
) -> Result<Child, StartError> {
    let log_path = dir.join(LOG_FILE);
    let log = open_log(&log_path, port, args).map_err(StartError::Fatal)?;
    let log_err = log
        .try_clone()
        .map_err(|err| StartError::Fatal(format!("cannot clone log file handle: {err}")))?;
    let mut child = Command::new(binary)
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::from(log))
        .stderr(Stdio::from(log_err))
        .spawn()
        .map_err(|err| StartError::Fatal(format!("cannot spawn {}: {err}", binary.display())))?;

    let deadline = Instant::now() + READY_TIMEOUT;
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return Err(exited_error(status, port, &log_path)),
            Ok(None) => {}
            Err(err) => {
                kill_and_reap(&mut child);
                return Err(StartError::Fatal(format!(
                    "cannot poll child process: {err}"
                )));
            }
        }
        if info_pid(port) == Some(child.id()) {
            return Ok(child);
        }
        if Instant::now() >= deadline {
            kill_and_reap(&mut child);
            return Err(StartError::Fatal(format!(
                "redis-server (pid {}) on 127.0.0.1:{port} did not answer PING within {:?}.\n\
                 command: {} {}\n--- log tail ({}) ---\n{}",
                child.id(),
                READY_TIMEOUT,
                binary.display(),
                args.join(" "),
                log_path.display(),
                log_tail(&log_path)
            )));
        }
        thread::sleep(Duration::from_millis(10));
    }
}

fn open_log(path: &Path, port: u16, args: &[String]) -> Result<File, String> {
    let mut log = OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(|err| format!("cannot open log file {}: {err}", path.display()))?;
    writeln!(log, "{ATTEMPT_MARKER} on port {port}: {args:?}")
        .map_err(|err| format!("cannot write log file {}: {err}", path.display()))?;
    Ok(log)
}

fn exited_error(status: ExitStatus, port: u16, log_path: &Path) -> StartError {
    let tail = log_tail(log_path);
    let message = format!(
        "redis-server for port {port} exited during startup ({status}).\n--- log tail ({}) ---\n{tail}",
        log_path.display()
    );
    if tail.contains("Address already in use") {
        StartError::AddressInUse(message)
    } else {
        StartError::Fatal(message)
    }
}

/// The last lines of the log written since the last start attempt.
pub(crate) fn log_tail(log_path: &Path) -> String {
    let content = match fs::read_to_string(log_path) {
        Ok(content) => content,
        Err(err) => return format!("<cannot read {}: {err}>", log_path.display()),
    };
    let since_attempt = content
        .rfind(ATTEMPT_MARKER)
        .map_or(content.as_str(), |at| &content[at..]);
    let lines: Vec<&str> = since_attempt.lines().collect();
    lines[lines.len().saturating_sub(TAIL_LINES)..].join("\n")
}

/// The `process_id` reported by `INFO server` on `port`, if it answers.
fn info_pid(port: u16) -> Option<u32> {
    let info: String = query(port, &["INFO", "server"], Duration::from_millis(250)).ok()?;
    info.lines()
        .find_map(|line| line.strip_prefix("process_id:"))
        .and_then(|pid| pid.trim().parse().ok())
}

/// Builds a command from string arguments.
///
/// # Panics
///
/// Panics if `args` is empty.
pub(crate) fn build_cmd(args: &[&str]) -> redis::Cmd {
    let (name, rest) = args
        .split_first()
        .expect("a Redis command needs at least a name");
    let mut cmd = redis::cmd(name);
    for arg in rest {
        cmd.arg(*arg);
    }
    cmd
}

/// Runs one command on a fresh blocking connection to `127.0.0.1:port`, with
/// `timeout` applied to connecting, reading and writing.
pub(crate) fn query<T: FromRedisValue>(
    port: u16,
    args: &[&str],
    timeout: Duration,
) -> RedisResult<T> {
    let client = redis::Client::open(url(port))?;
    let mut con = client.get_connection_with_timeout(timeout)?;
    con.set_read_timeout(Some(timeout))?;
    con.set_write_timeout(Some(timeout))?;
    build_cmd(args).query(&mut con)
}

/// The `redis://` URL of a server on the loopback interface.
pub(crate) fn url(port: u16) -> String {
    format!("redis://127.0.0.1:{port}/")
}

/// Sends `signal` (a name such as `STOP`) to `pid` with the `kill` command.
pub(crate) fn send_signal(pid: u32, signal: &str) -> Result<(), String> {
    let output = Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(pid.to_string())
        .stdin(Stdio::null())
        .output()
        .map_err(|err| format!("cannot run `kill -{signal} {pid}`: {err}"))?;
    if output.status.success() {
        Ok(())
    } else {
        Err(format!(
            "`kill -{signal} {pid}` failed ({}): {}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        ))
    }
}

/// SIGTERM (plus SIGCONT, so a paused server can act on it), then SIGKILL if
/// the process is still alive after `grace`; always reaps the child.
pub(crate) fn terminate(child: &mut Child, grace: Duration) {
    if matches!(child.try_wait(), Ok(Some(_))) {
        return;
    }
    let pid = child.id();
    // Errors are ignored: the process may exit between the checks.
    let _ = send_signal(pid, "TERM");
    let _ = send_signal(pid, "CONT");
    let deadline = Instant::now() + grace;
    while Instant::now() < deadline {
        if matches!(child.try_wait(), Ok(Some(_))) {
            return;
        }
        thread::sleep(Duration::from_millis(10));
    }
    kill_and_reap(child);
}

/// SIGKILL and reap; a no-op for an already reaped child.
pub(crate) fn kill_and_reap(child: &mut Child) {
    let _ = child.kill();
    let _ = child.wait();
}

/// Whether `/proc/<pid>` exists and the process is not a zombie.
pub fn pid_is_alive(pid: u32) -> bool {
    let stat = PathBuf::from(format!("/proc/{pid}/stat"));
    match fs::read_to_string(stat) {
        // The state is the first field after the parenthesised command name.
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state != "Z" && state != "X"),
        Err(_) => false,
    }
}
