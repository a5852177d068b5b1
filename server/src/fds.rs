//! The open-file limit must hold every connection the server may accept
//! (`http.max_connections` per worker) plus what the relay opens itself:
//! checked at start, so a relay never runs into `Too many open files` with
//! its listener, store and peers starved.

/// Descriptors the relay uses besides client connections: the store's
/// files, the listener, each worker's event loop, stdio and logs.
pub const RESERVE: u64 = 256;

/// Descriptors needed for `max_connections` per worker on `workers`
/// workers, with `peer_connections` outgoing connections to peers.
pub fn needed(max_connections: usize, workers: usize, peer_connections: usize) -> u64 {
    (max_connections as u64).saturating_mul(workers as u64).saturating_add(peer_connections as u64) + RESERVE
}

/// The soft limit to run with, given the current soft and hard limits:
/// the current one if it suffices, else raised as far as needed (up to the
/// hard one); `None` when even the hard limit is too low.
pub fn soft_limit(needed: u64, soft: u64, hard: u64) -> Option<u64> {
    if needed <= soft {
        Some(soft)
    } else if needed <= hard {
        Some(needed)
    } else {
        None
    }
}

/// Makes `RLIMIT_NOFILE` hold `needed` descriptors (raising the soft limit
/// if it must), or explains which settings do not fit.
pub fn ensure(needed: u64, what: &str) -> Result<(), String> {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit writes into the struct we pass.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return Err(format!("getrlimit(RLIMIT_NOFILE): {}", std::io::Error::last_os_error()));
    }
    let (soft, hard): (u64, u64) = (lim.rlim_cur, lim.rlim_max);
    let Some(target) = soft_limit(needed, soft, hard) else {
        return Err(format!(
            "{what} needs {needed} open files ({RESERVE} reserved for the store, peers and the server), \
             over the open-file limit RLIMIT_NOFILE (soft {soft}, hard {hard}): lower http.max_connections \
             or http.workers, or raise the limit (ulimit -n, LimitNOFILE=)"
        ));
    };
    if target != soft {
        lim.rlim_cur = target;
        // SAFETY: setrlimit reads the struct we pass.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) } != 0 {
            return Err(format!("setrlimit(RLIMIT_NOFILE, {target}): {}", std::io::Error::last_os_error()));
        }
        tracing::info!(from = soft, to = target, "raised the open-file soft limit");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connections_times_workers_plus_the_reserve_must_fit_the_limit() {
        assert_eq!(needed(1000, 2, 64), 2000 + 64 + RESERVE);
        let n = needed(1000, 2, 0);
        assert_eq!(soft_limit(n, 4096, 4096), Some(4096), "fits: unchanged");
        assert_eq!(soft_limit(n, 1024, 4096), Some(n), "soft raised as far as needed");
        assert_eq!(soft_limit(n, 1024, n), Some(n), "up to the hard limit");
        assert_eq!(soft_limit(n, 1024, n - 1), None, "over the hard limit: refused");
    }
}
