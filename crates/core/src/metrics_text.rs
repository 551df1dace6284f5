//! Reading a backend's own Prometheus metrics (text exposition format 0.0.4), as the
//! source paper's server-load module reads each server's figures.
//!
//! The scraper (in the runtime) fetches the text; this module turns two successive
//! scrapes into load figures. Counters become rates over the time between scrapes, a
//! histogram's `_sum`/`_count` become the mean latency of the requests in between, and
//! node_exporter's per-mode CPU seconds become a utilisation. Conventions supported out
//! of the box: flowgate's own `httpd`, nginx-prometheus-exporter and node_exporter.

use std::time::Instant;

/// Which series to read. Each is optional; what is absent is simply not reported.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetricNames {
    /// A counter of requests served (its rate is the request rate).
    pub requests: Option<String>,
    /// Gauges of requests or connections in progress, summed (e.g. being served plus
    /// queued for a worker: both are in flight from a client's point of view).
    pub active: Vec<String>,
    /// A histogram (or summary) of request durations in seconds: `_sum` and `_count`.
    pub response_time: Option<String>,
    /// node_exporter's `node_cpu_seconds_total` (by `mode`): utilisation = 1 − idle share.
    pub cpu: Option<String>,
}

impl Default for MetricNames {
    /// flowgate's `httpd` names, which follow the Prometheus client conventions.
    fn default() -> Self {
        MetricNames {
            requests: Some("http_requests_total".into()),
            active: vec![
                "http_requests_in_flight".into(),
                "http_requests_queued".into(),
            ],
            response_time: Some("http_request_duration_seconds".into()),
            cpu: Some("node_cpu_seconds_total".into()),
        }
    }
}

impl MetricNames {
    /// The names nginx-prometheus-exporter exports (it has no latency histogram).
    pub fn nginx() -> Self {
        MetricNames {
            requests: Some("nginx_http_requests_total".into()),
            active: vec!["nginx_connections_active".into()],
            response_time: None,
            cpu: Some("node_cpu_seconds_total".into()),
        }
    }
}

/// The raw totals read from one scrape.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Totals {
    pub requests: Option<f64>,
    pub active: Option<f64>,
    pub duration_sum: Option<f64>,
    pub duration_count: Option<f64>,
    pub cpu_total: Option<f64>,
    pub cpu_idle: Option<f64>,
}

/// Load figures derived from two scrapes.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct LoadSample {
    pub rps: Option<f64>,
    pub active: Option<f64>,
    pub response_time_ms: Option<f64>,
    /// 0..=1.
    pub cpu: Option<f64>,
}

/// Parse one sample line: `name{labels} value [timestamp]`. Returns the name, the raw
/// label text and the value. Comments and blank lines give `None`.
fn sample(line: &str) -> Option<(&str, &str, f64)> {
    let line = line.trim();
    if line.is_empty() || line.starts_with('#') {
        return None;
    }
    let (name, rest) = match line.find(['{', ' ']) {
        Some(i) => line.split_at(i),
        None => return None,
    };
    let (labels, rest) = if let Some(r) = rest.strip_prefix('{') {
        let end = r.find('}')?;
        (&r[..end], &r[end + 1..])
    } else {
        ("", rest)
    };
    let value = rest.split_whitespace().next()?;
    let v = match value {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        v => v.parse().ok()?,
    };
    Some((name, labels, v))
}

/// Sum every series of `name` (across labels) — a server's total, however it is split.
fn sum_of(text: &str, name: &str) -> Option<f64> {
    let mut found = false;
    let mut total = 0.0;
    for (n, _, v) in text.lines().filter_map(sample) {
        if n == name && v.is_finite() {
            found = true;
            total += v;
        }
    }
    found.then_some(total)
}

/// Read the totals named in `names` from a scrape's text.
pub fn totals(text: &str, names: &MetricNames) -> Totals {
    let mut t = Totals {
        requests: names.requests.as_deref().and_then(|n| sum_of(text, n)),
        active: names
            .active
            .iter()
            .filter_map(|n| sum_of(text, n))
            .reduce(|a, b| a + b),
        ..Totals::default()
    };
    if let Some(h) = names.response_time.as_deref() {
        t.duration_sum = sum_of(text, &format!("{h}_sum"));
        t.duration_count = sum_of(text, &format!("{h}_count"));
    }
    if let Some(c) = names.cpu.as_deref() {
        let (mut total, mut idle, mut found) = (0.0, 0.0, false);
        for (n, labels, v) in text.lines().filter_map(sample) {
            if n == c && v.is_finite() {
                found = true;
                total += v;
                if labels.contains("mode=\"idle\"") {
                    idle += v;
                }
            }
        }
        if found {
            t.cpu_total = Some(total);
            t.cpu_idle = Some(idle);
        }
    }
    t
}

/// Two scrapes, and the figures they imply. Counter resets (a restarted server) give no
/// rate for that interval rather than a negative one.
pub fn derive(prev: (Instant, Totals), now: (Instant, Totals)) -> LoadSample {
    let dt = now.0.saturating_duration_since(prev.0).as_secs_f64();
    let (a, b) = (prev.1, now.1);
    let delta = |x: Option<f64>, y: Option<f64>| match (x, y) {
        (Some(x), Some(y)) if y >= x => Some(y - x),
        _ => None,
    };
    let rps = if dt > 0.0 {
        delta(a.requests, b.requests).map(|d| d / dt)
    } else {
        None
    };
    let response_time_ms = match (
        delta(a.duration_sum, b.duration_sum),
        delta(a.duration_count, b.duration_count),
    ) {
        (Some(s), Some(c)) if c > 0.0 => Some(s / c * 1000.0),
        _ => None,
    };
    let cpu = match (
        delta(a.cpu_total, b.cpu_total),
        delta(a.cpu_idle, b.cpu_idle),
    ) {
        (Some(t), Some(i)) if t > 0.0 => Some((1.0 - i / t).clamp(0.0, 1.0)),
        _ => None,
    };
    LoadSample {
        rps,
        active: b.active,
        response_time_ms,
        cpu,
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    const HTTPD_1: &str = "# HELP http_requests_total Requests.\n# TYPE http_requests_total counter\nhttp_requests_total{code=\"200\"} 100\nhttp_requests_total{code=\"503\"} 4\nhttp_requests_in_flight 3\nhttp_requests_queued 2\nhttp_request_duration_seconds_bucket{le=\"+Inf\"} 104\nhttp_request_duration_seconds_sum 5.2\nhttp_request_duration_seconds_count 104\n";
    const HTTPD_2: &str = "http_requests_total{code=\"200\"} 296\nhttp_requests_total{code=\"503\"} 8\nhttp_requests_in_flight 7\nhttp_request_duration_seconds_sum 15.2\nhttp_request_duration_seconds_count 304\n";

    #[test]
    fn rates_and_mean_latency_come_from_deltas() {
        let t0 = Instant::now();
        let a = totals(HTTPD_1, &MetricNames::default());
        let b = totals(HTTPD_2, &MetricNames::default());
        assert_eq!(a.requests, Some(104.0));
        let s = derive((t0, a), (t0 + Duration::from_secs(2), b));
        assert_eq!(s.rps, Some(100.0));
        assert_eq!(s.active, Some(7.0));
        assert_eq!(a.active, Some(5.0), "served plus queued");
        // 10 s of service over 200 requests: 50 ms each.
        assert!((s.response_time_ms.unwrap() - 50.0).abs() < 1e-9);
    }

    #[test]
    fn node_exporter_cpu_is_one_minus_the_idle_share() {
        let t0 = Instant::now();
        let names = MetricNames::nginx();
        let a = totals(
            "node_cpu_seconds_total{cpu=\"0\",mode=\"idle\"} 100\nnode_cpu_seconds_total{cpu=\"0\",mode=\"user\"} 50\nnginx_http_requests_total 10\nnginx_connections_active 2\n",
            &names,
        );
        let b = totals(
            "node_cpu_seconds_total{cpu=\"0\",mode=\"idle\"} 101\nnode_cpu_seconds_total{cpu=\"0\",mode=\"user\"} 53\nnginx_http_requests_total 30\nnginx_connections_active 5\n",
            &names,
        );
        let s = derive((t0, a), (t0 + Duration::from_secs(4), b));
        assert!((s.cpu.unwrap() - 0.75).abs() < 1e-9);
        assert_eq!(s.rps, Some(5.0));
        assert_eq!(s.active, Some(5.0));
        assert_eq!(s.response_time_ms, None);
    }

    #[test]
    fn a_counter_reset_gives_no_rate_and_garbage_gives_nothing() {
        let t0 = Instant::now();
        let a = totals("http_requests_total 500\n", &MetricNames::default());
        let b = totals("http_requests_total 3\n", &MetricNames::default());
        assert_eq!(derive((t0, a), (t0 + Duration::from_secs(1), b)).rps, None);
        let g = totals(
            "}{ garbage\nhttp_requests_total{ 1\nhttp_requests_total NaNx\n\u{0}",
            &MetricNames::default(),
        );
        assert_eq!(g, Totals::default());
    }
}
