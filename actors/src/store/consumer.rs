//! Ordered consumers (R1, in memory) for the cluster engine's reads of a
//! stream: the replay, the checkpoint read, the fence walk (`jetstream.rs`,
//! `checkpoint.rs`), created so that a dead peer does not hold them up.
//!
//! nats-server places a new R1 consumer on one of the stream's peers that
//! it does not know to be gone (`createGroupForConsumer`), and only that
//! peer answers the create. A peer killed without a goodbye (`kill -9`, a
//! lost machine) counts as alive until the orphan check notices it: up to
//! 150 s (`orphMax`: 5 × the 30 s statsz interval, `events.go`). Until then
//! one create in three on an R3 stream goes to the dead peer and is never
//! answered (measured: 12 of 30 creates after a kill of the stream's
//! leader; every answered one on a live peer). One create waited out the
//! request timeout (5 s) and failed the open, and a takeover after such a
//! kill kept failing for tens of seconds (issue 40: "replay consumer:
//! timed out"). So creates are hedged: another goes every [`HEDGE`] while
//! none has answered, up to [`TRIES`]; the first answer wins, and a slow
//! but live create is never given up on.

use std::future::Future;
use std::time::Duration;

use async_nats::jetstream::consumer::{pull::OrderedConfig, Consumer};
use async_nats::jetstream::stream;
use futures_util::stream::FuturesUnordered;
use futures_util::StreamExt;

use super::types::{jetstream_err, StoreError};

/// After this long without an answer a create gets another beside it: a
/// create nats-server answers at all is answered within milliseconds on a
/// quiet cluster, and one it does not answer is lost for good.
const HEDGE: Duration = Duration::from_millis(250);

/// Creates sent at most for one consumer: all of them lost to the dead
/// one of a 3-server stream's peers is (1/3)^8, one in 6,561.
const TRIES: u32 = 8;

/// Creates an ordered consumer on `stream`, hedged. Creates answered after
/// the first are deleted (an ordered consumer nobody pulls would go by
/// itself after 30 s, its `inactive_threshold`).
pub(super) async fn ordered(
    stream: &stream::Stream,
    config: OrderedConfig,
    what: &str,
) -> Result<Consumer<OrderedConfig>, StoreError> {
    let create = || {
        let (stream, config) = (stream.clone(), config.clone());
        async move { stream.create_consumer(config).await }
    };
    let (created, sent, mut late) = first_answer(create, HEDGE, TRIES).await;
    if sent > 1 {
        tracing::info!(stream = %stream.cached_info().config.name, sent,
            "jetstream: a consumer create was not answered at once; more were sent beside it");
    }
    if !late.is_empty() {
        let stream = stream.clone();
        tokio::spawn(async move {
            while let Some(answer) = late.next().await {
                if let Ok(consumer) = answer {
                    let _ = stream.delete_consumer(&consumer.cached_info().name).await;
                }
            }
        });
    }
    created.map_err(|e| jetstream_err(what, e))
}

/// Starts `start()`, and another every `every` while none has answered,
/// up to `tries`: the first success, or (all failed) the last failure;
/// also how many were started, and those still unanswered.
async fn first_answer<T, E, Fut>(
    mut start: impl FnMut() -> Fut,
    every: Duration,
    tries: u32,
) -> (Result<T, E>, u32, FuturesUnordered<Fut>)
where
    Fut: Future<Output = Result<T, E>>,
{
    let mut pending = FuturesUnordered::new();
    let (mut started, mut failed) = (0, None);
    let mut next = tokio::time::Instant::now();
    loop {
        // A failure answered at once is followed at once.
        if started < tries.max(1) && (pending.is_empty() || tokio::time::Instant::now() >= next) {
            pending.push(start());
            started += 1;
            next = tokio::time::Instant::now() + every;
        }
        if pending.is_empty() {
            // Every one started, and every one failed.
            let failed = failed.expect("the tries that ended failed");
            return (Err(failed), started, pending);
        }
        tokio::select! {
            Some(answer) = pending.next() => match answer {
                Ok(done) => return (Ok(done), started, pending),
                Err(e) => failed = Some(e),
            },
            () = tokio::time::sleep_until(next), if started < tries => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::future::pending;
    use tokio::time::{sleep, Instant};

    /// The takeover: the creates that went to a dead peer are
    /// never answered; the first one placed on a live peer is, within a
    /// hedge of its start.
    #[tokio::test(start_paused = true)]
    async fn a_create_that_is_never_answered_is_passed_by_the_next_one_sent_beside_it() {
        let mut n = 0;
        let create = || {
            n += 1;
            let me = n;
            async move {
                if me <= 2 {
                    pending::<()>().await;
                }
                Ok::<_, String>(me)
            }
        };
        let began = Instant::now();
        let (got, sent, late) = first_answer(create, HEDGE, TRIES).await;
        assert_eq!((got, sent, late.len()), (Ok(3), 3, 2));
        assert_eq!(began.elapsed(), HEDGE * 2);
    }

    /// A slow answer is never given up on: the first create, answered
    /// after three hedges, wins over the ones sent beside it.
    #[tokio::test(start_paused = true)]
    async fn a_slow_create_is_not_given_up_for_the_ones_sent_after_it() {
        let mut n = 0u32;
        let create = || {
            n += 1;
            let me = n;
            async move {
                match me {
                    1 => sleep(HEDGE * 3 + HEDGE / 2).await,
                    _ => pending::<()>().await,
                }
                Ok::<_, String>(me)
            }
        };
        let began = Instant::now();
        let (got, sent, _) = first_answer(create, HEDGE, TRIES).await;
        assert_eq!((got, sent), (Ok(1), 4));
        assert_eq!(began.elapsed(), HEDGE * 3 + HEDGE / 2);
    }

    /// Every create failing (each after its request timeout) fails once
    /// the last has: the wait is bounded by the hedges and one timeout. A
    /// failure answered at once is followed at once.
    #[tokio::test(start_paused = true)]
    async fn creates_that_all_fail_fail_with_the_last_failure_within_the_hedges_and_one_timeout() {
        let mut n = 0u32;
        let create = || {
            n += 1;
            let me = n;
            async move {
                sleep(Duration::from_secs(5)).await;
                Err::<(), _>(format!("timed out {me}"))
            }
        };
        let began = Instant::now();
        let (got, sent, late) = first_answer(create, HEDGE, TRIES).await;
        assert_eq!((got, sent, late.len()), (Err(format!("timed out {TRIES}")), TRIES, 0));
        assert_eq!(began.elapsed(), HEDGE * (TRIES - 1) + Duration::from_secs(5));

        let (mut n, began) = (0u32, Instant::now());
        let refused = || {
            n += 1;
            let me = n;
            async move { Err::<(), _>(me) }
        };
        let (got, sent, _) = first_answer(refused, HEDGE, TRIES).await;
        assert_eq!((got, sent), (Err(TRIES), TRIES));
        assert_eq!(began.elapsed(), Duration::ZERO);
    }
}
