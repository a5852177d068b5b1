//! Plain SVG charts for the HTML report: a line chart and a histogram,
//! strings built here so the page needs no script, font or network.

use std::fmt::Write;

const W: f64 = 640.0;
const H: f64 = 260.0;
/// Plot area margins: left (y labels), right, top (title), bottom (x labels).
const ML: f64 = 64.0;
const MR: f64 = 16.0;
const MT: f64 = 30.0;
const MB: f64 = 40.0;
/// One colour per run: A, B.
pub const COLOURS: [&str; 2] = ["#1f6fb4", "#d2452b"];

/// Text for HTML content and attribute values.
pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// A linear map from a domain to pixels.
#[derive(Clone, Copy, Debug)]
pub struct Scale {
    d0: f64,
    d1: f64,
    r0: f64,
    r1: f64,
}

impl Scale {
    /// An empty domain (one value) is widened so every value maps inside.
    pub fn new((d0, d1): (f64, f64), (r0, r1): (f64, f64)) -> Scale {
        let (d0, d1) = if d1 > d0 { (d0, d1) } else { (d0 - 0.5, d0 + 0.5) };
        Scale { d0, d1, r0, r1 }
    }

    pub fn at(&self, v: f64) -> f64 {
        self.r0 + (v - self.d0) / (self.d1 - self.d0) * (self.r1 - self.r0)
    }
}

/// About `n` round ticks (steps of 1, 2 or 5 × 10^k) from `lo` to at least
/// `hi`: the last tick is the axis' top.
pub fn ticks(lo: f64, hi: f64, n: usize) -> Vec<f64> {
    let span = if hi > lo { hi - lo } else { lo.abs().max(1.0) };
    let raw = span / n.max(1) as f64;
    let mag = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 5.0, 10.0].iter().map(|m| m * mag).find(|s| *s >= raw).unwrap_or(10.0 * mag);
    let first = (lo / step).floor() as i64;
    let last = ((hi.max(lo + step * 1e-9)) / step).ceil() as i64;
    (first..=last).map(|i| i as f64 * step).collect()
}

/// A tick label: short, no float noise.
pub fn label(v: f64) -> String {
    let a = v.abs();
    if a >= 1e9 {
        format!("{}G", trim(v / 1e9))
    } else if a >= 1e6 {
        format!("{}M", trim(v / 1e6))
    } else if a >= 1e4 {
        format!("{}k", trim(v / 1e3))
    } else {
        trim(v)
    }
}

fn trim(v: f64) -> String {
    let s = format!("{:.3}", v);
    let s = s.trim_end_matches('0').trim_end_matches('.');
    if s == "-0" {
        "0".into()
    } else {
        s.into()
    }
}

/// One line of a chart: a run's points, in x order.
pub struct Series<'a> {
    pub name: &'a str,
    pub points: Vec<(f64, f64)>,
}

fn frame(out: &mut String, title: &str, x_label: &str, y_label: &str) {
    let _ = write!(
        out,
        r#"<svg class="chart" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {W} {H}" width="{W}" height="{H}" role="img"><title>{t}</title><text x="{ML}" y="18" class="title">{t}</text><text x="{x}" y="{y}" class="axis" text-anchor="middle">{xl}</text><text transform="translate(14 {ym}) rotate(-90)" class="axis" text-anchor="middle">{yl}</text>"#,
        t = escape(title),
        x = ML + (W - ML - MR) / 2.0,
        y = H - 6.0,
        xl = escape(x_label),
        ym = MT + (H - MT - MB) / 2.0,
        yl = escape(y_label),
    );
}

fn y_axis(out: &mut String, max: f64) -> Scale {
    let ys = ticks(0.0, max, 5);
    let y = Scale::new((0.0, *ys.last().unwrap_or(&1.0)), (H - MB, MT));
    for t in &ys {
        let py = y.at(*t);
        let _ = write!(
            out,
            r#"<line x1="{ML}" x2="{x2}" y1="{py:.1}" y2="{py:.1}" class="grid"/><text x="{lx}" y="{ty:.1}" class="tick" text-anchor="end">{l}</text>"#,
            x2 = W - MR,
            lx = ML - 6.0,
            ty = py + 4.0,
            l = label(*t),
        );
    }
    y
}

fn legend(out: &mut String, names: &[&str]) {
    if names.len() < 2 {
        return;
    }
    for (i, name) in names.iter().enumerate() {
        let x = W - MR - 220.0 + 110.0 * i as f64;
        let _ = write!(
            out,
            r#"<rect x="{x}" y="8" width="10" height="10" fill="{c}"/><text x="{tx}" y="17" class="tick">{n}</text>"#,
            c = COLOURS[i % 2],
            tx = x + 14.0,
            n = escape(&name.chars().take(16).collect::<String>()),
        );
    }
}

fn no_data(out: &mut String) {
    let _ = write!(
        out,
        r#"<text x="{x}" y="{y}" class="axis" text-anchor="middle">no data in this report</text></svg>"#,
        x = W / 2.0,
        y = H / 2.0
    );
}

/// A line chart of `series` (one colour each, dots at the points, y from
/// 0); `x_ticks`, when given, replaces the round x ticks (a log axis drawn
/// in transformed coordinates, say).
pub fn line_chart(
    title: &str,
    x_label: &str,
    y_label: &str,
    series: &[Series],
    x_ticks: Option<&[(f64, String)]>,
) -> String {
    let mut out = String::new();
    frame(&mut out, title, x_label, y_label);
    let all = || series.iter().flat_map(|s| s.points.iter());
    if all().next().is_none() {
        no_data(&mut out);
        return out;
    }
    let (mut x0, mut x1) = all().fold((f64::MAX, f64::MIN), |(a, b), p| (a.min(p.0), b.max(p.0)));
    if let Some(t) = x_ticks {
        x0 = t.iter().map(|t| t.0).fold(x0, f64::min);
        x1 = t.iter().map(|t| t.0).fold(x1, f64::max);
    }
    let y = y_axis(&mut out, all().map(|p| p.1).fold(0.0, f64::max));
    let x = Scale::new((x0, x1), (ML, W - MR));
    let round: Vec<(f64, String)>;
    let xt = match x_ticks {
        Some(t) => t,
        None => {
            round = ticks(x0, x1, 6).into_iter().filter(|t| (x0..=x1).contains(t)).map(|t| (t, label(t))).collect();
            &round
        }
    };
    for (t, l) in xt {
        let _ = write!(
            out,
            r#"<text x="{px:.1}" y="{py}" class="tick" text-anchor="middle">{l}</text>"#,
            px = x.at(*t),
            py = H - MB + 16.0,
            l = escape(l)
        );
    }
    for (i, s) in series.iter().enumerate() {
        let c = COLOURS[i % 2];
        let mut d = String::new();
        for (k, (px, py)) in s.points.iter().map(|p| (x.at(p.0), y.at(p.1))).enumerate() {
            let _ = write!(d, "{}{px:.1},{py:.1}", if k == 0 { "M" } else { " L" });
        }
        let _ = write!(
            out,
            r#"<path d="{d}" fill="none" stroke="{c}" stroke-width="2"><title>{}</title></path>"#,
            escape(s.name)
        );
        for p in &s.points {
            let _ = write!(out, r#"<circle cx="{:.1}" cy="{:.1}" r="2.5" fill="{c}"/>"#, x.at(p.0), y.at(p.1));
        }
    }
    legend(&mut out, &series.iter().map(|s| s.name).collect::<Vec<_>>());
    out.push_str("</svg>");
    out
}

/// A histogram: one bar per bucket and run (side by side), the bar's
/// height its share of the run's samples in %; `buckets` are the x labels,
/// `series` the runs' counts per bucket.
pub fn histogram(title: &str, x_label: &str, buckets: &[String], series: &[(&str, Vec<u64>)]) -> String {
    let mut out = String::new();
    frame(&mut out, title, x_label, "% of sends");
    let shares: Vec<Vec<f64>> = series
        .iter()
        .map(|(_, counts)| {
            let total = counts.iter().sum::<u64>().max(1) as f64;
            counts.iter().map(|&n| n as f64 * 100.0 / total).collect()
        })
        .collect();
    if buckets.is_empty() || shares.iter().all(|s| s.iter().all(|v| *v == 0.0)) {
        no_data(&mut out);
        return out;
    }
    let y = y_axis(&mut out, shares.iter().flatten().copied().fold(0.0, f64::max));
    let band = (W - ML - MR) / buckets.len() as f64;
    let bar = band * 0.9 / series.len().max(1) as f64;
    // About 8 labels whatever the bucket count.
    let every = buckets.len().div_ceil(8);
    for (b, l) in buckets.iter().enumerate() {
        let bx = ML + band * b as f64;
        if b % every == 0 {
            let _ = write!(
                out,
                r#"<text x="{bx:.1}" y="{py}" class="tick" text-anchor="middle">{l}</text>"#,
                py = H - MB + 16.0,
                l = escape(l)
            );
        }
        for (i, s) in shares.iter().enumerate() {
            let v = s.get(b).copied().unwrap_or(0.0);
            if v > 0.0 {
                let top = y.at(v);
                let _ = write!(
                    out,
                    r#"<path d="M{x0:.1},{b0:.1} V{top:.1} H{x1:.1} V{b0:.1} Z" fill="{c}"><title>{l}: {v:.2} %</title></path>"#,
                    x0 = bx + band * 0.05 + bar * i as f64,
                    x1 = bx + band * 0.05 + bar * (i + 1) as f64,
                    b0 = y.at(0.0),
                    c = COLOURS[i % 2],
                    l = escape(l),
                );
            }
        }
    }
    legend(&mut out, &series.iter().map(|s| s.0).collect::<Vec<_>>());
    out.push_str("</svg>");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escape_covers_markup_and_quotes() {
        assert_eq!(escape(r#"<a href="x">'&'</a>"#), "&lt;a href=&quot;x&quot;&gt;&#39;&amp;&#39;&lt;/a&gt;");
        assert_eq!(escape("µs ✓"), "µs ✓");
    }

    #[test]
    fn a_scale_maps_the_domain_onto_the_range_even_inverted() {
        let s = Scale::new((0.0, 10.0), (200.0, 0.0));
        assert_eq!(s.at(0.0), 200.0);
        assert_eq!(s.at(10.0), 0.0);
        assert_eq!(s.at(2.5), 150.0);
        // One value: it lands in the middle, not at a division by zero.
        let one = Scale::new((3.0, 3.0), (0.0, 100.0));
        assert_eq!(one.at(3.0), 50.0);
    }

    #[test]
    fn ticks_are_round_and_cover_the_range() {
        assert_eq!(ticks(0.0, 10.0, 5), [0.0, 2.0, 4.0, 6.0, 8.0, 10.0]);
        assert_eq!(ticks(0.0, 9.3, 5), [0.0, 2.0, 4.0, 6.0, 8.0, 10.0]);
        assert_eq!(ticks(0.0, 0.37, 4), [0.0, 0.1, 0.2, 0.30000000000000004, 0.4]);
        assert_eq!(ticks(0.0, 1234.0, 5), [0.0, 500.0, 1000.0, 1500.0]);
        // A flat series (all zero) still gets an axis.
        assert_eq!(ticks(0.0, 0.0, 5), [0.0, 0.2]);
    }

    #[test]
    fn labels_are_short() {
        assert_eq!(label(0.30000000000000004), "0.3");
        assert_eq!(label(1500.0), "1500");
        assert_eq!(label(25_000.0), "25k");
        assert_eq!(label(52_428_800.0), "52.429M");
        assert_eq!(label(-0.0), "0");
    }

    #[test]
    fn a_line_chart_draws_a_path_per_series_and_escapes_names() {
        let a = Series { name: "A <old>", points: vec![(1.0, 10.0), (2.0, 20.0), (3.0, 15.0)] };
        let b = Series { name: "B", points: vec![(1.0, 5.0)] };
        let svg = line_chart("p99 & co", "s", "ms", &[a, b], None);
        assert!(svg.starts_with("<svg") && svg.ends_with("</svg>"), "{svg}");
        assert_eq!(svg.matches("<path d=\"M").count(), 2, "{svg}");
        assert_eq!(svg.matches("<circle").count(), 4, "{svg}");
        assert!(svg.contains("p99 &amp; co") && svg.contains("A &lt;old&gt;") && !svg.contains("<old>"), "{svg}");
        // The highest point (20) is under the top tick (20): inside the plot.
        assert!(svg.contains(&format!("M{ML:.1},")), "the first point at the left edge: {svg}");
        let top = Scale::new((0.0, 20.0), (H - MB, MT)).at(20.0);
        assert!(svg.contains(&format!(" L{:.1},{top:.1}", Scale::new((1.0, 3.0), (ML, W - MR)).at(2.0))), "{svg}");
    }

    #[test]
    fn a_chart_without_points_says_so() {
        let svg = line_chart("t", "x", "y", &[Series { name: "A", points: vec![] }], None);
        assert!(svg.contains("no data") && !svg.contains("<path"), "{svg}");
        let h = histogram("t", "ms", &[], &[("A", vec![])]);
        assert!(h.contains("no data"), "{h}");
    }

    #[test]
    fn histogram_bars_are_shares_of_each_run() {
        let buckets = vec!["1".to_string(), "2".to_string(), "4".to_string()];
        let svg = histogram("latency", "ms", &buckets, &[("A", vec![1, 3, 0]), ("B", vec![10, 0, 10])]);
        // A: 25 % and 75 %; B: 50 % and 50 %; no bar for an empty bucket.
        assert_eq!(svg.matches("<path").count(), 4, "{svg}");
        for t in ["1: 25.00 %", "2: 75.00 %", "1: 50.00 %", "4: 50.00 %"] {
            assert!(svg.contains(t), "{t}: {svg}");
        }
        assert!(svg.contains(COLOURS[1]), "B in its colour: {svg}");
    }
}
