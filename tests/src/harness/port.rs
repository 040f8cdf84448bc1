//! Loopback port allocation that is safe for tests running in parallel.
//!
//! A port is found by binding a [`TcpListener`] on `127.0.0.1:0`, reading the
//! port the kernel picked and dropping the listener again. Between the drop and
//! the moment `redis-server` binds the port, somebody else may take it; the
//! callers therefore retry with a fresh port when the server fails with
//! "Address already in use".
//!
//! Inside one process, every port handed out stays *reserved* until its
//! [`PortReservation`] is dropped, so two servers started by parallel tests of
//! the same binary never receive the same port, even while one of them is
//! stopped (for example in the middle of a restart).

use std::collections::HashSet;
use std::net::{Ipv4Addr, TcpListener};
use std::sync::{Mutex, MutexGuard, OnceLock};

/// How many times the kernel is asked for a port before giving up.
const MAX_ATTEMPTS: usize = 1000;

fn reserved() -> MutexGuard<'static, HashSet<u16>> {
    static RESERVED: OnceLock<Mutex<HashSet<u16>>> = OnceLock::new();
    RESERVED
        .get_or_init(|| Mutex::new(HashSet::new()))
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A loopback port that no other harness user in this process will be given
/// until this value is dropped.
#[derive(Debug)]
pub struct PortReservation {
    port: u16,
}

impl PortReservation {
    /// Asks the kernel for a currently free port on `127.0.0.1` and reserves it
    /// for this process.
    ///
    /// # Panics
    ///
    /// Panics if no port can be bound on the loopback interface.
    pub fn new() -> Self {
        let mut last_error = None;
        for _ in 0..MAX_ATTEMPTS {
            let port = match TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
                .and_then(|listener| listener.local_addr())
            {
                Ok(addr) => addr.port(),
                Err(err) => {
                    last_error = Some(err);
                    continue;
                }
            };
            // The listener is dropped here: the port is free again for redis.
            if reserved().insert(port) {
                return Self { port };
            }
        }
        panic!(
            "could not allocate a free port on 127.0.0.1 after {MAX_ATTEMPTS} attempts \
             (last error: {last_error:?})"
        );
    }

    /// The reserved port number.
    pub fn port(&self) -> u16 {
        self.port
    }
}

impl Default for PortReservation {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for PortReservation {
    fn drop(&mut self) {
        reserved().remove(&self.port);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reserved_ports_are_distinct_until_dropped() {
        let ports: Vec<PortReservation> = (0..50).map(|_| PortReservation::new()).collect();
        let unique: HashSet<u16> = ports.iter().map(PortReservation::port).collect();
        assert_eq!(unique.len(), ports.len());
        let first = ports[0].port();
        drop(ports);
        assert!(!reserved().contains(&first));
    }
}
