//! The HTML report of one run (`--report`) or two (`--compare A B
//! --report`): one self-contained page, inline CSS and SVG, no script.
//! It draws what each JSON report has: a report written before the series
//! and histogram existed still gets its tables and percentile chart.

use super::html::{self, escape, Series};
use super::report::{ratio, COMPARED};
use super::series::bucket_low;
use serde_json::Value;
use std::fmt::Write;

const STYLE: &str = "body{font:14px/1.4 system-ui,sans-serif;margin:24px;color:#222;max-width:1340px}\
h1{font-size:22px}h2{font-size:17px;margin-top:28px}\
table{border-collapse:collapse;margin:8px 0}td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}\
th:first-child,td:first-child{text-align:left}.charts{display:flex;flex-wrap:wrap;gap:12px}\
.chart{border:1px solid #ddd;background:#fff}.title{font-weight:600;font-size:13px}\
.axis{font-size:11px;fill:#444}.tick{font-size:10px;fill:#555}.grid{stroke:#eee}.A{color:#1f6fb4}.B{color:#d2452b}";

/// The percentiles drawn and tabled: (JSON key, label, x on the chart:
/// -log10(1 - p), HdrHistogram's "nines" axis; max one step past 99.9 %).
const PERCENTILES: [(&str, &str, f64); 5] = [
    ("send_p50_ms", "p50", std::f64::consts::LOG10_2),
    ("send_p90_ms", "p90", 1.0),
    ("send_p99_ms", "p99", 2.0),
    ("send_p999_ms", "p99.9", 3.0),
    ("send_max_ms", "max", 4.0),
];

fn cell(v: &Value) -> String {
    match v {
        Value::Null => "-".into(),
        Value::String(s) => escape(s),
        v => escape(&v.to_string()),
    }
}

/// A table: a header of the runs' names (and B/A with two runs when
/// `ratios`), a row per `(label, key)` that some run has.
fn table(
    out: &mut String,
    runs: &[(&str, &Value)],
    rows: &[(&str, &str)],
    ratios: bool,
    get: fn(&Value, &str) -> Value,
) {
    let ratios = ratios && runs.len() == 2;
    out.push_str("<table><tr><th></th>");
    for (name, _) in runs {
        let _ = write!(out, "<th>{}</th>", escape(name));
    }
    if ratios {
        out.push_str("<th>B/A</th>");
    }
    out.push_str("</tr>");
    for (label, key) in rows {
        let values: Vec<Value> = runs.iter().map(|(_, r)| get(r, key)).collect();
        if values.iter().all(Value::is_null) {
            continue;
        }
        let _ = write!(out, "<tr><td>{}</td>", escape(label));
        for v in &values {
            let _ = write!(out, "<td>{}</td>", cell(v));
        }
        if let ([a, b], true) = (&values[..], ratios) {
            let _ = write!(out, "<td>{}</td>", ratio(a, b).map_or_else(|| "-".into(), |r| format!("{r:.3}")));
        }
        out.push_str("</tr>");
    }
    out.push_str("</table>");
}

/// The points of `series[*][field]` over `t_s`, scaled by `k`.
fn over_time<'a>(name: &'a str, r: &Value, field: &str, k: f64) -> Series<'a> {
    let points = r["series"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|s| Some((s["t_s"].as_f64()?, s[field].as_f64()? * k)))
        .collect();
    Series { name, points }
}

/// The histogram's buckets (ms labels) over all runs, and each run's counts.
fn buckets<'a>(runs: &[(&'a str, &Value)]) -> (Vec<String>, Vec<(&'a str, Vec<u64>)>) {
    let pairs = |r: &Value| -> Vec<(u64, u64)> {
        let h = r["send_histogram_us"].as_array().cloned().unwrap_or_default();
        h.iter().filter_map(|b| Some((b[0].as_u64()?, b[1].as_u64()?))).collect()
    };
    let mut lows: Vec<u64> = runs.iter().flat_map(|(_, r)| pairs(r)).map(|p| p.0).collect();
    lows.sort_unstable();
    lows.dedup();
    // Fill the gaps between the lowest and highest bucket, so the x axis is
    // log-scaled evenly (a bucket is 1/8 of an octave).
    if let (Some(&lo), Some(&hi)) = (lows.first(), lows.last()) {
        let b = super::series::bucket;
        lows = (b(lo)..=b(hi)).map(bucket_low).collect();
    }
    let counts = runs
        .iter()
        .map(|(name, r)| {
            let p = pairs(r);
            (*name, lows.iter().map(|l| p.iter().find(|x| x.0 == *l).map_or(0, |x| x.1)).collect())
        })
        .collect();
    (lows.iter().map(|us| html::label(*us as f64 / 1000.0)).collect(), counts)
}

fn config_keys(runs: &[(&str, &Value)]) -> Vec<String> {
    let mut keys: Vec<String> =
        runs.iter().flat_map(|(_, r)| r["config"].as_object().into_iter().flat_map(|o| o.keys().cloned())).collect();
    keys.sort();
    keys.dedup();
    keys
}

/// The page for `runs` (one or two: name and JSON report).
pub fn render(runs: &[(&str, &Value)]) -> String {
    let title = match runs {
        [(a, _), (b, _)] => format!("relay bench: {a} vs {b}"),
        _ => "relay bench report".to_string(),
    };
    let mut out = format!(
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>{t}</title><style>{STYLE}</style></head><body><h1>{t}</h1>",
        t = escape(&title)
    );
    out.push_str("<h2>Runs</h2>");
    let run_rows = [
        ("date", "date"),
        ("version", "version"),
        ("git", "git"),
        ("build", "profile"),
        ("cores", "nproc"),
        ("CPU", "cpu_model"),
    ];
    table(&mut out, runs, &run_rows, false, |r, k| r["run"][k].clone());

    out.push_str("<h2>Figures</h2>");
    let (counters, figures): (Vec<_>, Vec<_>) =
        COMPARED.iter().map(|(k, l)| (*l, *k)).partition(|(_, k)| k.ends_with("_per_send"));
    table(&mut out, runs, &figures, true, |r, k| r[k].clone());

    out.push_str("<h2>Send latency (ms, open loop from the due time under --rate)</h2>");
    let pct_rows: Vec<(&str, &str)> = PERCENTILES.iter().map(|(k, l, _)| (*l, *k)).collect();
    table(&mut out, runs, &pct_rows, true, |r, k| r[k].clone());

    out.push_str("<div class=\"charts\">");
    let by_percentile: Vec<Series> = runs
        .iter()
        .map(|(name, r)| Series {
            name,
            points: PERCENTILES.iter().filter_map(|(k, _, x)| Some((*x, r[*k].as_f64()?))).collect(),
        })
        .collect();
    let nines: Vec<(f64, String)> = PERCENTILES.iter().map(|(_, l, x)| (*x, l.to_string())).collect();
    out.push_str(&html::line_chart("Latency by percentile", "percentile", "ms", &by_percentile, Some(&nines)));
    let (labels, counts) = buckets(runs);
    out.push_str(&html::histogram("Latency histogram", "ms (bucket start)", &labels, &counts));
    let charts: [(&str, &str, &str, f64); 5] = [
        ("Throughput", "send_per_sec", "sends/s", 1.0),
        ("p99 latency per second", "p99_ms", "ms", 1.0),
        ("p50 latency per second", "p50_ms", "ms", 1.0),
        ("Relay CPU (all relays)", "relay_cpu_pct", "% of one core", 1.0),
        ("Relay RSS (all relays)", "relay_rss_bytes", "MiB", 1.0 / 1048576.0),
    ];
    for (title, field, unit, k) in charts {
        let series: Vec<Series> = runs.iter().map(|(name, r)| over_time(name, r, field, k)).collect();
        out.push_str(&html::line_chart(title, "s into the window", unit, &series, None));
    }
    out.push_str("</div>");

    out.push_str("<h2>Per send</h2>");
    table(&mut out, runs, &counters, true, |r, k| r[k].clone());

    out.push_str("<h2>Configuration</h2>");
    let keys = config_keys(runs);
    let rows: Vec<(&str, &str)> = keys.iter().map(|k| (k.as_str(), k.as_str())).collect();
    table(&mut out, runs, &rows, false, |r, k| r["config"][k].clone());

    for (name, r) in runs {
        for e in r["error_samples"].as_array().into_iter().flatten() {
            let _ = write!(out, "<p>{}: error: {}</p>", escape(name), cell(e));
        }
    }
    out.push_str("</body></html>\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn run() -> Value {
        json!({
            "config": {"concurrency": 4, "relay_urls": ["http://127.0.0.1:1"]},
            "run": {"date": "2026-12-05T10:00:00Z", "version": "0.1.0", "git": null, "profile": "debug", "nproc": 2},
            "send_per_sec": 100.0, "relay_cpu_us_per_send": 50.0,
            "send_p50_ms": 1.0, "send_p90_ms": 2.0, "send_p99_ms": 4.0, "send_p999_ms": 8.0, "send_max_ms": 9.0,
            "send_histogram_us": [[960, 5], [1024, 3], [4096, 1]],
            "series": [
                {"t_s": 1.0, "send_per_sec": 90.0, "p50_ms": 1.0, "p99_ms": 3.0, "relay_cpu_pct": 40.0, "relay_rss_bytes": 1048576},
                {"t_s": 2.0, "send_per_sec": 110.0, "p50_ms": 1.0, "p99_ms": 5.0, "relay_cpu_pct": null, "relay_rss_bytes": null},
            ],
            "error_samples": ["<boom>"],
        })
    }

    #[test]
    fn one_run_draws_every_chart_and_table() {
        let page = render(&[("this run", &run())]);
        assert!(page.starts_with("<!doctype html>") && page.ends_with("</html>\n"));
        assert_eq!(page.matches("<svg").count(), 7, "{page}");
        assert!(!page.contains("no data"), "every chart has data: {page}");
        assert!(!page.contains("<script") && !page.contains("http://127.0.0.1:1\""), "no script, no link: {page}");
        assert!(page.contains("<td>p99.9</td><td>8.0</td>"), "{page}");
        assert!(page.contains("<td>relay CPU µs/send</td><td>50.0</td>"), "{page}");
        assert!(page.contains("<td>concurrency</td><td>4</td>"), "{page}");
        assert!(page.contains("error: &lt;boom&gt;"), "{page}");
        assert!(!page.contains("B/A"), "{page}");
    }

    #[test]
    fn two_runs_get_ratios_and_an_older_report_plots_what_it_has() {
        let b = run();
        // Written before the series, the histogram, p90 and p99.9 existed.
        let old = json!({"config": {"concurrency": 8}, "send_per_sec": 50.0, "send_p50_ms": 2.0, "send_p99_ms": 6.0, "send_max_ms": 7.0});
        let page = render(&[("A: old.json", &old), ("B: new.json", &b)]);
        assert!(page.contains("<th>B/A</th>"), "{page}");
        assert!(page.contains("<td>send/s</td><td>50.0</td><td>100.0</td><td>2.000</td>"), "{page}");
        assert!(page.contains("<td>p90</td><td>-</td><td>2.0</td><td>-</td>"), "{page}");
        // Settings and machines are set side by side, not divided.
        assert!(page.contains("<td>concurrency</td><td>8</td><td>4</td></tr>"), "{page}");
        // Both runs on the percentile chart; the time series only for B.
        assert_eq!(page.matches("<svg").count(), 7, "{page}");
        assert!(!page.contains("no data"), "{page}");
        assert!(page.contains("<title>A: old.json</title>") && page.contains("<title>B: new.json</title>"), "{page}");
    }

    #[test]
    fn the_histogram_axis_fills_the_buckets_between() {
        let r = run();
        let (labels, counts) = buckets(&[("A", &r)]);
        // 960 µs … 4096 µs: every 1/8-octave bucket between, empty ones at 0.
        assert_eq!(labels.first().map(String::as_str), Some("0.96"));
        assert_eq!(labels.last().map(String::as_str), Some("4.096"));
        assert_eq!(labels.len(), 18);
        assert_eq!(counts[0].1.iter().sum::<u64>(), 9);
        assert_eq!(counts[0].1[0], 5);
    }
}
