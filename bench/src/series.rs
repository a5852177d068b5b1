//! What the report plots: the sends per second of the window (throughput,
//! p50/p99 of the replies that came in that second), the relays' CPU and
//! RSS sampled once a second, and a log-bucketed latency histogram.
//!
//! The histogram is ours, not the `hdrhistogram` crate (not in the tree):
//! the bench keeps every latency, so its percentiles are exact from the
//! sorted samples, and the histogram only has to draw them: eight buckets
//! per power of two (12.5 % wide), HdrHistogram's layout at low precision.

use serde_json::{json, Value};
use std::time::Duration;

/// Sub-buckets per power of two.
const SUB: u64 = 8;

/// The bucket of value `v`: exact below `SUB`, then `SUB` per octave.
pub fn bucket(v: u64) -> u64 {
    if v < SUB {
        return v;
    }
    let e = 63 - u64::from(v.leading_zeros()); // floor(log2 v) ≥ 3
    let sub = (v >> (e - 3)) & (SUB - 1);
    SUB * (e - 2) + sub
}

/// The smallest value of bucket `b` (the inverse of [`bucket`]).
pub fn bucket_low(b: u64) -> u64 {
    if b < SUB {
        return b;
    }
    let (e, sub) = (b / SUB + 2, b % SUB);
    (SUB + sub) << (e - 3)
}

/// `[[lowest µs of the bucket, count], …]` of the non-empty buckets, in order.
pub fn histogram(us: &[u64]) -> Value {
    let mut counts = std::collections::BTreeMap::new();
    for &v in us {
        *counts.entry(bucket(v)).or_insert(0u64) += 1;
    }
    Value::from(counts.into_iter().map(|(b, n)| json!([bucket_low(b), n])).collect::<Vec<_>>())
}

/// The percentile of sorted `us` at `p` (nearest rank), in ms.
pub fn percentile_ms(sorted: &[u64], p: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let i = ((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1;
    Some(sorted[i] as f64 / 1000.0)
}

fn round(v: f64) -> f64 {
    (v * 1000.0).round() / 1000.0
}

/// The shortest interval a CPU share is computed over.
const MIN_CPU_INTERVAL: Duration = Duration::from_millis(200);

/// The relays' CPU and RSS, read once a second during the window.
pub struct Sampler<R> {
    read: R,
    last: Option<(Duration, f64)>,
    /// `(second, CPU % of one core, RSS bytes)`: second `k` covers `k-1..k`.
    pub samples: Vec<(u64, Option<f64>, Option<u64>)>,
}

impl<R: FnMut() -> (Option<f64>, Option<u64>)> Sampler<R> {
    /// `read` gives the relays' CPU seconds and RSS bytes summed (None when
    /// one cannot be read); it is read once now, at the window's start.
    pub fn new(mut read: R) -> Self {
        let last = read().0.map(|cpu| (Duration::ZERO, cpu));
        Sampler { read, last, samples: Vec::new() }
    }

    /// Called often (every load tick) with the time since the window
    /// started: takes a sample when a new whole second has passed.
    pub fn poll(&mut self, elapsed: Duration) {
        let second = elapsed.as_secs();
        if second > self.samples.last().map_or(0, |s| s.0) {
            self.sample(second, elapsed);
        }
    }

    /// At the end of the window: a sample for the last, partial second.
    pub fn finish(&mut self, elapsed: Duration) {
        let last = self.samples.last().map_or(0, |s| s.0);
        if elapsed.as_secs_f64() > last as f64 + 0.001 {
            self.sample(last + 1, elapsed);
        }
    }

    fn sample(&mut self, second: u64, elapsed: Duration) {
        let (cpu, rss) = (self.read)();
        // CPU time moves in 10 ms ticks: over less than MIN_CPU_INTERVAL a
        // share would be mostly rounding, so none is given (and the
        // interval runs on to the next sample).
        let pct = match (self.last, cpu) {
            (Some((t0, c0)), Some(c1)) if elapsed.saturating_sub(t0) >= MIN_CPU_INTERVAL => {
                self.last = Some((elapsed, c1));
                Some(round((c1 - c0) / (elapsed - t0).as_secs_f64() * 100.0))
            }
            (None, Some(c1)) => {
                self.last = Some((elapsed, c1));
                None
            }
            _ => None,
        };
        self.samples.push((second, pct, rss));
    }
}

/// One entry a second of the window: `t_s` (its end), `send_per_sec`
/// (replies that came in it / its length), `p50_ms` and `p99_ms` of their
/// latencies (null when none came), and the relays' `relay_cpu_pct` and
/// `relay_rss_bytes` (null when not sampled). The last entry ends with the
/// window; a last part shorter than half a second joins the second before,
/// where its few replies do not read as a collapse of the throughput.
pub fn per_second(replies: &[(u64, u64)], elapsed: Duration, samples: &[(u64, Option<f64>, Option<u64>)]) -> Value {
    let end = elapsed.as_secs_f64().max(1e-3);
    let whole = elapsed.as_secs();
    let n = if whole >= 1 && end - (whole as f64) < 0.5 { whole } else { whole + 1 };
    let mut buckets: Vec<Vec<u64>> = vec![Vec::new(); n as usize];
    for &(at_ms, us) in replies {
        buckets[(at_ms / 1000).min(n - 1) as usize].push(us);
    }
    let series = buckets.into_iter().enumerate().map(|(k, mut us)| {
        us.sort_unstable();
        let k = k as u64;
        // The last entry takes the latest of the samples at or after its
        // second that has a figure (the one at the very end may have no CPU).
        let (t_end, last) = if k + 1 == n { (end, u64::MAX) } else { ((k + 1) as f64, k + 1) };
        let mine = || samples.iter().rev().filter(|s| (k + 1..=last).contains(&s.0));
        json!({
            "t_s": round(t_end),
            "send_per_sec": round(us.len() as f64 / (t_end - k as f64).max(1e-3)),
            "p50_ms": percentile_ms(&us, 0.50),
            "p99_ms": percentile_ms(&us, 0.99),
            "relay_cpu_pct": mine().find_map(|s| s.1),
            "relay_rss_bytes": mine().find_map(|s| s.2),
        })
    });
    Value::from(series.collect::<Vec<_>>())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_exact_below_eight_then_eight_per_octave() {
        for v in 0..8 {
            assert_eq!(bucket(v), v);
        }
        assert_eq!(bucket(8), 8);
        assert_eq!(bucket(15), 15);
        assert_eq!(bucket(16), 16);
        assert_eq!(bucket(17), 16, "16 and 17 share the bucket 16..18");
        assert_eq!(bucket(18), 17);
        for v in [1u64, 9, 100, 1_000, 12_345, 999_999, 1 << 40] {
            let b = bucket(v);
            assert!(bucket_low(b) <= v && v < bucket_low(b + 1), "{v} in bucket {b}");
            assert_eq!(bucket(bucket_low(b)), b);
            // At most 12.5 % wide.
            assert!((bucket_low(b + 1) - bucket_low(b)) * 8 <= bucket_low(b).max(8), "{v}");
        }
    }

    #[test]
    fn the_histogram_counts_every_sample_once() {
        let h = histogram(&[5, 5, 100, 101, 1000]);
        // 100 and 101 share the bucket 96..104.
        assert_eq!(h, json!([[5, 2], [96, 2], [960, 1]]));
        let total: u64 = h.as_array().unwrap().iter().map(|b| b[1].as_u64().unwrap()).sum();
        assert_eq!(total, 5);
    }

    #[test]
    fn percentiles_are_nearest_rank() {
        let us: Vec<u64> = (1..=1000).map(|v| v * 1000).collect();
        assert_eq!(percentile_ms(&us, 0.5), Some(500.0));
        assert_eq!(percentile_ms(&us, 0.999), Some(999.0));
        assert_eq!(percentile_ms(&us, 1.0), Some(1000.0));
        assert_eq!(percentile_ms(&[], 0.5), None);
    }

    #[test]
    fn the_sampler_takes_one_sample_a_second_and_one_at_the_end() {
        // CPU grows by 0.5 s per read; RSS by 1 MB.
        let mut reads = 0u64;
        let mut s = Sampler::new(|| {
            reads += 1;
            (Some(reads as f64 * 0.5), Some(reads << 20))
        });
        s.poll(Duration::from_millis(400));
        assert!(s.samples.is_empty());
        s.poll(Duration::from_millis(1000));
        s.poll(Duration::from_millis(1100));
        s.poll(Duration::from_millis(2000));
        s.finish(Duration::from_millis(2500));
        // 0.5 s of CPU in 1 s: 50 %; in the last 0.5 s: 100 %.
        assert_eq!(
            s.samples,
            vec![(1, Some(50.0), Some(2 << 20)), (2, Some(50.0), Some(3 << 20)), (3, Some(100.0), Some(4 << 20))]
        );
        // A window that ends on a sample adds none.
        s.finish(Duration::from_millis(2500));
        assert_eq!(s.samples.len(), 3);
    }

    #[test]
    fn a_last_second_too_short_for_a_cpu_share_has_none() {
        let mut cpu = 0.0;
        let mut s = Sampler::new(|| {
            cpu += 0.25;
            (Some(cpu), Some(1))
        });
        s.poll(Duration::from_millis(1000));
        s.finish(Duration::from_millis(1050));
        assert_eq!(s.samples, vec![(1, Some(25.0), Some(1)), (2, None, Some(1))]);
    }

    #[test]
    fn a_sampler_without_proc_records_nulls() {
        let mut s = Sampler::new(|| (None, None));
        s.poll(Duration::from_secs(1));
        assert_eq!(s.samples, vec![(1, None, None)]);
    }

    #[test]
    fn per_second_counts_the_replies_of_each_second() {
        // Three replies in second 1, one in the last half second.
        let replies = [(10, 1000), (500, 3000), (999, 2000), (1200, 9000)];
        let samples = [(1, Some(50.0), Some(10)), (2, Some(20.0), Some(11))];
        let s = per_second(&replies, Duration::from_millis(1500), &samples);
        assert_eq!(
            s,
            json!([
                {"t_s": 1.0, "send_per_sec": 3.0, "p50_ms": 2.0, "p99_ms": 3.0, "relay_cpu_pct": 50.0, "relay_rss_bytes": 10},
                {"t_s": 1.5, "send_per_sec": 2.0, "p50_ms": 9.0, "p99_ms": 9.0, "relay_cpu_pct": 20.0, "relay_rss_bytes": 11},
            ])
        );
        let quiet = per_second(&[], Duration::from_millis(2000), &[]);
        assert_eq!(
            quiet[1],
            json!({"t_s": 2.0, "send_per_sec": 0.0, "p50_ms": null, "p99_ms": null, "relay_cpu_pct": null, "relay_rss_bytes": null})
        );
        assert_eq!(per_second(&[], Duration::from_millis(300), &[]).as_array().map(Vec::len), Some(1));
    }

    #[test]
    fn a_short_last_part_joins_the_second_before() {
        // 2.2 s: second 1, then 1..2.2 (1.2 s) with the replies at 1.5 and 2.1,
        // and the sample taken at the end (second 3).
        let replies = [(500, 1000), (1500, 1000), (2100, 1000)];
        let samples = [(1, Some(10.0), Some(1)), (2, Some(20.0), Some(2)), (3, Some(30.0), Some(3))];
        let s = per_second(&replies, Duration::from_millis(2200), &samples);
        let s = s.as_array().unwrap();
        assert_eq!(s.len(), 2, "{s:?}");
        assert_eq!(s[1]["t_s"], 2.2);
        assert_eq!(s[1]["send_per_sec"], round(2.0 / 1.2));
        assert_eq!(s[1]["relay_cpu_pct"], 30.0, "the last sample: {s:?}");
        // The very last sample came too soon for a CPU share: the one before.
        let samples = [(1, Some(10.0), Some(1)), (2, Some(20.0), Some(2)), (3, None, Some(3))];
        let s = per_second(&replies, Duration::from_millis(2200), &samples);
        assert_eq!((&s[1]["relay_cpu_pct"], &s[1]["relay_rss_bytes"]), (&json!(20.0), &json!(3)), "{s}");
    }
}
