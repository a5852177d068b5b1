//! Per-connection data, set by actix-web's `on_connect` for every accepted
//! TCP connection (HTTP and WebSocket alike): the socket, for options set
//! later, and the connection's slot in the per-IP count. The slot is freed
//! when actix-http drops the connection, so the count is of open sockets.
//! A connection over `http.max_connections_per_ip` is still accepted by the
//! kernel, but its first request is refused (`rate_limited`) and the
//! connection closed after that answer; one that sends nothing is closed by
//! `http.request_timeout`.
//!
//! A trusted proxy's connections are not counted: every client behind it
//! shares them, and which client a connection serves is known only once a
//! request's header is read. Clients behind a proxy are held per client
//! address by the request rate limits and, for the long-lived WebSockets,
//! by a count of their own ([`PerIp`] keyed by the resolved address, see
//! `super::ws`); the proxy caps its own connections per client.

use super::client_addr::TrustedProxies;
use actix_tls::accept::rustls_0_23::TlsStream;
use actix_web::dev::Extensions;
use actix_web::rt::net::TcpStream;
use relay_core::flow::within_cap;
use std::any::Any;
use std::collections::HashMap;
use std::net::IpAddr;
use std::os::fd::{AsRawFd, FromRawFd, RawFd};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

/// Open connections per client IP.
#[derive(Clone)]
pub struct PerIp {
    max: usize,
    counts: Arc<Mutex<HashMap<IpAddr, usize>>>,
    /// Peers whose connections are not counted (trusted proxies).
    exempt: Arc<TrustedProxies>,
}

impl PerIp {
    pub fn new(max: usize) -> Self {
        PerIp { max, counts: Default::default(), exempt: Default::default() }
    }

    /// Leaves the connections of `proxies` uncounted.
    pub fn exempting(mut self, proxies: TrustedProxies) -> Self {
        self.exempt = Arc::new(proxies);
        self
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

    /// The `on_connect` callback: a slot (unless from an exempt peer) and
    /// the socket for each connection, plain or TLS.
    pub fn on_connect(self) -> impl Fn(&dyn Any, &mut Extensions) + Send + Sync + 'static {
        move |conn, ext| {
            let stream = match conn.downcast_ref::<TcpStream>() {
                Some(plain) => plain,
                None => match conn.downcast_ref::<TlsStream<TcpStream>>() {
                    Some(tls) => tls.get_ref().0,
                    None => return,
                },
            };
            if let Ok(peer) = stream.peer_addr() {
                if !self.exempt.trusts(peer.ip()) {
                    ext.insert(self.open(peer.ip()));
                }
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
/// is being handled, or while its response body is alive (the WebSocket
/// task checks that), when actix-http certainly still holds it open.
#[derive(Clone, Copy)]
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

    /// A descriptor of the caller's own for this socket (see [`Held`]).
    /// Call only while actix-http holds the socket open.
    pub fn hold(&self) -> Option<Held> {
        // SAFETY: dup of a descriptor actix-http holds open; the new one is ours to close.
        let fd = unsafe { libc::fcntl(self.0, libc::F_DUPFD_CLOEXEC, 0) };
        // SAFETY: `fd` is a fresh descriptor nobody else owns.
        (fd >= 0).then(|| Held(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) }))
    }
}

/// A connection's socket, by a descriptor of its own: valid whatever
/// actix-http does meanwhile (its number cannot be reused for another
/// connection while held), closed when dropped. The WebSocket task holds
/// one only while it closes, to see whether the client took what was sent
/// and to drop a connection that does not.
pub struct Held(std::os::fd::OwnedFd);

impl Held {
    /// The kernel's TCP state (`TCP_ESTABLISHED` = 1, …) and the bytes sent
    /// and not yet acknowledged or not yet sent (`SIOCOUTQ`).
    fn state(&self) -> Option<(u8, i32)> {
        let fd = self.0.as_raw_fd();
        // SAFETY: getsockopt/ioctl on our own descriptor into locals of the right size.
        unsafe {
            let mut info: libc::tcp_info = std::mem::zeroed();
            let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
            let r = libc::getsockopt(
                fd,
                libc::IPPROTO_TCP,
                libc::TCP_INFO,
                &mut info as *mut libc::tcp_info as *mut libc::c_void,
                &mut len,
            );
            let mut outq: libc::c_int = 0;
            let q = libc::ioctl(fd, libc::TIOCOUTQ, &mut outq);
            (r == 0 && q == 0).then_some((info.tcpi_state, outq))
        }
    }

    /// Nothing is left for the client to take: it closed its side, or the
    /// relay's side is closed (FIN sent) and every byte was acknowledged.
    pub fn settled(&self) -> bool {
        const ESTABLISHED: u8 = 1;
        const FIN_WAIT1: u8 = 4;
        const FIN_WAIT2: u8 = 5;
        match self.state() {
            Some((state, outq)) => {
                let peer_open = matches!(state, ESTABLISHED | FIN_WAIT1 | FIN_WAIT2);
                !peer_open || (state != ESTABLISHED && outq == 0)
            }
            None => true,
        }
    }

    /// Drops the connection now: what is still queued for the client is
    /// discarded (an RST instead of a FIN after the queue), and actix-http,
    /// whose next read or write on it fails, lets it go and frees its
    /// buffers.
    pub fn abort(&self) {
        let fd = self.0.as_raw_fd();
        let linger = libc::linger { l_onoff: 1, l_linger: 0 };
        // SAFETY: setsockopt/shutdown on our own descriptor, with a local of the option's size.
        unsafe {
            libc::setsockopt(
                fd,
                libc::SOL_SOCKET,
                libc::SO_LINGER,
                &linger as *const libc::linger as *const libc::c_void,
                std::mem::size_of::<libc::linger>() as libc::socklen_t,
            );
            libc::shutdown(fd, libc::SHUT_RDWR);
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
