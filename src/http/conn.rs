//! Per-connection data, set by actix-web's `on_connect` for every accepted
//! TCP connection (HTTP and WebSocket alike): the socket, for options set
//! later, and the connection's slot in the per-IP count. The slot is freed
//! when actix-http drops the connection, so the count is of open sockets.
//! A connection over `http.max_connections_per_ip` is still accepted by the
//! kernel, but its first request is refused (`rate_limited`) and the
//! connection closed after that answer; one that sends nothing is closed by
//! `http.request_timeout`.

use actix_web::dev::Extensions;
use actix_web::rt::net::TcpStream;
use std::any::Any;
use std::collections::HashMap;
use std::net::IpAddr;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

/// Whether a connection that makes `count` from its IP (itself included)
/// is within the cap.
pub fn within_cap(count: usize, max_per_ip: usize) -> bool {
    count <= max_per_ip
}

/// Open connections per client IP.
#[derive(Clone)]
pub struct PerIp {
    max: usize,
    counts: Arc<Mutex<HashMap<IpAddr, usize>>>,
}

impl PerIp {
    pub fn new(max: usize) -> Self {
        PerIp { max, counts: Default::default() }
    }

    fn counts(&self) -> MutexGuard<'_, HashMap<IpAddr, usize>> {
        self.counts.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Counts a new connection from `ip`; the slot frees it when dropped.
    pub fn open(&self, ip: IpAddr) -> Slot {
        let mut counts = self.counts();
        let n = counts.entry(ip).or_default();
        *n += 1;
        Slot { ip, within: within_cap(*n, self.max), per_ip: self.clone() }
    }

    /// Open connections from `ip`.
    pub fn count(&self, ip: IpAddr) -> usize {
        self.counts().get(&ip).copied().unwrap_or(0)
    }

    /// The `on_connect` callback: a slot and the socket for each connection.
    pub fn on_connect(self) -> impl Fn(&dyn Any, &mut Extensions) + Send + Sync + 'static {
        move |conn, ext| {
            let Some(stream) = conn.downcast_ref::<TcpStream>() else { return };
            if let Ok(peer) = stream.peer_addr() {
                ext.insert(self.open(peer.ip()));
            }
            ext.insert(Socket(stream.as_raw_fd()));
        }
    }
}

/// A connection's place in its IP's count.
pub struct Slot {
    ip: IpAddr,
    /// Whether the connection was within the cap when it was opened.
    pub within: bool,
    per_ip: PerIp,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut counts = self.per_ip.counts();
        if let Some(n) = counts.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                counts.remove(&self.ip);
            }
        }
    }
}

/// The connection's socket. Only used while a request of that connection
/// is being handled, when actix-http certainly still holds it open.
pub struct Socket(RawFd);

impl Socket {
    /// Data written and not acknowledged by the client for `timeout` makes
    /// the kernel drop the connection (also when the client's receive
    /// window stays closed): actix-http's buffers for it are then freed.
    pub fn set_user_timeout(&self, timeout: Duration) {
        let ms = libc::c_uint::try_from(timeout.as_millis()).unwrap_or(libc::c_uint::MAX);
        // SAFETY: a setsockopt on a socket actix-http holds open, with a
        // pointer to a local of the option's size.
        let r = unsafe {
            libc::setsockopt(
                self.0,
                libc::IPPROTO_TCP,
                libc::TCP_USER_TIMEOUT,
                &ms as *const libc::c_uint as *const libc::c_void,
                std::mem::size_of::<libc::c_uint>() as libc::socklen_t,
            )
        };
        if r != 0 {
            tracing::debug!(error = %std::io::Error::last_os_error(), "TCP_USER_TIMEOUT");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connections_from_one_ip_are_counted_up_to_the_cap_and_freed_on_close() {
        let per_ip = PerIp::new(2);
        let (a, b): (IpAddr, IpAddr) = ("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap());
        let first = per_ip.open(a);
        let second = per_ip.open(a);
        let third = per_ip.open(a);
        assert!(first.within && second.within && !third.within);
        assert!(per_ip.open(b).within, "another IP has its own count");
        drop(third);
        drop(first);
        assert_eq!(per_ip.count(a), 1);
        assert!(per_ip.open(a).within, "a closed connection frees its slot");
        drop(second);
        assert_eq!(per_ip.count(a), 0);
        assert_eq!(per_ip.count(b), 0);
    }
}
