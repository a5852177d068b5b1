//! Waiting for the relays under test: poll a condition, bounded in time.
//! The one way tests wait for something they can observe (a status, a
//! metric, a log line, a file, a process's exit), so no test waits for a
//! guessed time.

use std::future::Future;
use std::time::{Duration, Instant};

/// Between two looks at the condition.
const POLL: Duration = Duration::from_millis(20);

/// Calls `check` until it answers `Ok`, for at most `limit`; then panics
/// with `what` and the last `Err` (what was seen instead).
pub async fn eventually<T, F, Fut>(what: &str, limit: Duration, check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, String>>,
{
    poll(limit, check).await.unwrap_or_else(|seen| panic!("{what}: {seen}"))
}

/// [`eventually`] for a thread outside the async runtime.
pub fn eventually_blocking<T>(what: &str, limit: Duration, mut check: impl FnMut() -> Result<T, String>) -> T {
    let deadline = Instant::now() + limit;
    loop {
        match check() {
            Ok(v) => return v,
            Err(seen) => assert!(Instant::now() < deadline, "{what}: not within {limit:?}; last seen: {seen}"),
        }
        // Waits for the relay processes (or a stand-in's threads) to change what `check` reads: the poll interval.
        std::thread::sleep(POLL);
    }
}

/// Like [`eventually`], for a caller that reports instead of panicking:
/// the last `Err` once `limit` has passed.
pub async fn poll<T, F, Fut>(limit: Duration, mut check: F) -> Result<T, String>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, String>>,
{
    let deadline = Instant::now() + limit;
    loop {
        match check().await {
            Ok(v) => return Ok(v),
            Err(seen) if Instant::now() >= deadline => return Err(format!("not within {limit:?}; last seen: {seen}")),
            Err(_) => {}
        }
        // Waits for the relay processes (or a stand-in's threads) to change what `check` reads: the poll interval.
        actix_rt::time::sleep(POLL).await;
    }
}
