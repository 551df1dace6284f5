//! Tables: CSV (every column), Markdown and terminal (the main ones), with the paper's
//! published figures beside ours where the paper gives them.

use std::fmt::Write as _;

use crate::measure::Row;

/// The paper's figures as quoted in the seed text (Tables 5, 6, 7 and the Case D baseline).
#[derive(Debug, Clone, Copy)]
pub struct PaperRow {
    pub label: &'static str,
    pub bdmax_gbps: f64,
    pub th_gbps: f64,
    pub dtransfer_gb: f64,
    pub isl_pct: Option<f64>,
    pub dtransfer_pct: Option<f64>,
}

/// Normal conditions (200 requests): 6.5 Gb/s, 5.6152 Gb/s, 7.019 GB.
pub const PAPER_NORMAL: PaperRow = PaperRow {
    label: "paper, normal (200 req)",
    bdmax_gbps: 6.5,
    th_gbps: 5.6152,
    dtransfer_gb: 7.019,
    isl_pct: None,
    dtransfer_pct: None,
};
/// Table 5, Case A heavy: 1.449 Gb/s, 1.322, 1.652 GB, %I_SL 77.70, %D_Transfer 76.49.
pub const PAPER_CASE_A: PaperRow = PaperRow {
    label: "paper, Case A heavy (Table 5)",
    bdmax_gbps: 1.449,
    th_gbps: 1.322,
    dtransfer_gb: 1.652,
    isl_pct: Some(77.70),
    dtransfer_pct: Some(76.49),
};
/// Table 6, Case B heavy: 5.561 Gb/s, 4.854, 6.068 GB, %I_SL 14.44, %D_Transfer 13.55.
pub const PAPER_CASE_B: PaperRow = PaperRow {
    label: "paper, Case B heavy (Table 6)",
    bdmax_gbps: 5.561,
    th_gbps: 4.854,
    dtransfer_gb: 6.068,
    isl_pct: Some(14.44),
    dtransfer_pct: Some(13.55),
};

/// Table 7, Case C, per domain controller (heavy; C_d1 and C_d3 6000 requests each, C_d2
/// and C_d4 4000 each), as quoted in the seed text.
pub const PAPER_CASE_C: [PaperRow; 4] = [
    PaperRow {
        label: "paper, C_d1 (Table 7, 6000 req)",
        bdmax_gbps: 5.901,
        th_gbps: 5.072,
        dtransfer_gb: 6.340,
        isl_pct: Some(9.21),
        dtransfer_pct: Some(9.67),
    },
    PaperRow {
        label: "paper, C_d2 (Table 7, 4000 req)",
        bdmax_gbps: 6.101,
        th_gbps: 5.201,
        dtransfer_gb: 6.501,
        isl_pct: Some(6.14),
        dtransfer_pct: Some(7.38),
    },
    PaperRow {
        label: "paper, C_d3 (Table 7, 6000 req)",
        bdmax_gbps: 5.901,
        th_gbps: 5.072,
        dtransfer_gb: 6.340,
        isl_pct: Some(9.21),
        dtransfer_pct: Some(9.67),
    },
    PaperRow {
        label: "paper, C_d4 (Table 7, 4000 req)",
        bdmax_gbps: 6.101,
        th_gbps: 5.201,
        dtransfer_gb: 6.501,
        isl_pct: Some(6.14),
        dtransfer_pct: Some(7.38),
    },
];

/// The paper rows shown beside a scenario's table.
pub fn paper_rows(scenario: &str) -> Vec<PaperRow> {
    match scenario {
        "case-a" => vec![PAPER_NORMAL, PAPER_CASE_A],
        "case-b" => vec![PAPER_NORMAL, PAPER_CASE_A, PAPER_CASE_B],
        "case-c" => {
            let mut v = vec![PAPER_NORMAL];
            v.extend(PAPER_CASE_C);
            v.push(PAPER_CASE_B);
            v
        }
        _ => vec![],
    }
}

/// Every row, every column, in [`COLUMNS`] order.
pub fn csv(rows: &[Row]) -> String {
    let mut out = COLUMNS.join(",");
    out.push('\n');
    for r in rows {
        let v = serde_json::to_value(r).unwrap_or_default();
        let vals: Vec<String> = COLUMNS
            .iter()
            .map(|k| match &v[*k] {
                serde_json::Value::Null => String::new(),
                serde_json::Value::String(s) => s.clone(),
                other => other.to_string(),
            })
            .collect();
        out += &vals.join(",");
        out.push('\n');
    }
    out
}

/// CSV column order (the field order of [`Row`]).
pub const COLUMNS: &[&str] = &[
    "scenario",
    "arm",
    "case",
    "algorithm",
    "phase",
    "offered",
    "duration_s",
    "clients_used",
    "clients_failed",
    "wall_s",
    "sent",
    "ok",
    "failed",
    "http_503",
    "timeouts",
    "syn_retransmits",
    "lat_p50_ms",
    "lat_p95_ms",
    "lat_p99_ms",
    "srv1",
    "srv2",
    "srv3",
    "srv4",
    "ctl_srv1",
    "ctl_srv2",
    "ctl_srv3",
    "ctl_srv4",
    "no_optimal_server",
    "moved_by_load",
    "moved_by_conns",
    "moved_by_rt",
    "ejections",
    "panics",
    "excused_answered_later",
    "excused_switch_behind",
    "outcomes_answered",
    "outcomes_unanswered",
    "outcomes_unjudged",
    "redispatched",
    "iperf_bytes",
    "iperf_secs",
    "iperf_max_bps",
    "ping_rtt_avg_ms",
    "ping_loss_pct",
    "qos_pass_ok",
    "ok_rps",
    "jain",
    "bdmax_gbps",
    "dtransfer_gb",
    "th_gbps",
    "de2e_ms",
    "tx_delay_ms",
    "isl_pct",
    "dtransfer_pct",
    "diff_delay_ms",
];

/// Parses a CSV written by [`csv`] back into rows (for tests and re-plotting).
pub fn parse_csv(text: &str) -> anyhow::Result<Vec<Row>> {
    let mut lines = text.lines();
    let header: Vec<&str> = lines.next().unwrap_or("").split(',').collect();
    let mut rows = Vec::new();
    for l in lines.filter(|l| !l.is_empty()) {
        let mut m = serde_json::Map::new();
        for (k, v) in header.iter().zip(l.split(',')) {
            // An empty cell is a missing value: the field's default (`None`, "").
            if v.is_empty() {
                continue;
            }
            let val = if let Ok(n) = v.parse::<u64>() {
                serde_json::Value::from(n)
            } else if let Ok(f) = v.parse::<f64>() {
                serde_json::Value::from(f)
            } else {
                serde_json::Value::String(v.to_owned())
            };
            m.insert((*k).to_owned(), val);
        }
        rows.push(serde_json::from_value(serde_json::Value::Object(m))?);
    }
    Ok(rows)
}

/// What a table shows for a missing value: a measurement that failed, or a figure that
/// does not apply (the normal phase's %I_SL).
pub const MISSING: &str = "—";

/// `v` with `digits` decimals, or [`MISSING`].
pub fn fmt(v: Option<f64>, digits: usize) -> String {
    v.map_or_else(|| MISSING.to_owned(), |v| format!("{v:.digits$}"))
}

fn opt(v: Option<f64>) -> String {
    fmt(v, 2)
}

/// The sentence that counts the failed measurements of `rows` (Case C's `all` row, made
/// from the others, is not counted), or `None` when none failed.
pub fn failures(rows: &[Row]) -> Option<String> {
    let measured: Vec<&Row> = rows.iter().filter(|r| r.arm != "all").collect();
    let (mut iperf, mut ping, mut clients) = (0, 0, 0);
    for r in &measured {
        let (i, p, c) = r.failures();
        iperf += i;
        ping += p;
        clients += c;
    }
    let used: u64 = measured.iter().map(|r| r.clients_used).sum();
    (iperf + ping + clients > 0).then(|| {
        format!(
            "**Failed measurements: {}** — iperf3 gave no result in {iperf} of {n} rows, ping no round-trip time in {ping} of {n}, {clients} of {used} load clients no report (their requests count as failed). Missing figures are shown as {MISSING} (empty in the CSV) and left out of averages and plots; never as zeros.",
            iperf + ping + clients,
            n = measured.len(),
        )
    })
}

/// The QoS table (the paper's columns) and the HTTP table, as Markdown.
pub fn markdown(scenario: &str, rows: &[Row]) -> String {
    let mut s = String::new();
    if let Some(f) = failures(rows) {
        let _ = writeln!(s, "{f}\n");
    }
    let _ = writeln!(s, "#### {scenario}: QoS (the paper's measures)\n");
    let _ = writeln!(
        s,
        "| arm | phase | B_d(max) Gb/s | T_h Gb/s | D_Transfer GB | %I_SL | %D_Transfer | D_E-E ms | Delay_Tx ms | ΔDelay_Tx ms |"
    );
    let _ = writeln!(s, "|---|---|---|---|---|---|---|---|---|---|");
    for r in rows {
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            r.arm,
            r.phase,
            fmt(r.bdmax_gbps, 3),
            fmt(r.th_gbps, 3),
            fmt(r.dtransfer_gb, 3),
            opt(r.isl_pct),
            opt(r.dtransfer_pct),
            fmt(r.de2e_ms, 3),
            fmt(r.tx_delay_ms, 1),
            opt(r.diff_delay_ms),
        );
    }
    for p in paper_rows(scenario) {
        let _ = writeln!(
            s,
            "| *{}* | | *{:.3}* | *{:.3}* | *{:.3}* | *{}* | *{}* | | | |",
            p.label,
            p.bdmax_gbps,
            p.th_gbps,
            p.dtransfer_gb,
            opt(p.isl_pct),
            opt(p.dtransfer_pct)
        );
    }
    if scenario == "case-d" {
        let _ = writeln!(
            s,
            "\nTable 8's per-algorithm figures are not quoted in the seed text; only its normal-load baseline is (B_d(max) 4.02 Gb/s, D_Transfer 7.02 GB over 15 s)."
        );
    }
    let _ = writeln!(s, "\n#### {scenario}: HTTP load and servers\n");
    let _ = writeln!(
        s,
        "| arm | phase | offered | ok | failed (503 / timeout) | ok/s | p50 ms | p95 ms | p99 ms | SYNs sent again | srv1 | srv2 | srv3 | srv4 | Jain | controller picks 1/2/3/4 | no optimal | ISSLM moves by load/conns/RT | connections judged: answered / not / no verdict | ejections / panics | silences excused: answered later / switch behind | redispatched |"
    );
    let _ = writeln!(
        s,
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
    );
    for r in rows {
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} ({} / {}) | {:.0} | {} | {} | {} | {} | {} | {} | {} | {} | {:.3} | {}/{}/{}/{} | {} | {}/{}/{} | {} / {} / {} | {} / {} | {} / {} | {} |",
            r.arm,
            r.phase,
            r.offered,
            r.ok,
            r.failed,
            r.http_503,
            r.timeouts,
            r.ok_rps,
            fmt(r.lat_p50_ms, 1),
            fmt(r.lat_p95_ms, 1),
            fmt(r.lat_p99_ms, 1),
            r.syn_retransmits
                .map_or_else(|| MISSING.to_owned(), |n| n.to_string()),
            r.srv1,
            r.srv2,
            r.srv3,
            r.srv4,
            r.jain,
            r.ctl_srv1,
            r.ctl_srv2,
            r.ctl_srv3,
            r.ctl_srv4,
            r.no_optimal_server,
            r.moved_by_load,
            r.moved_by_conns,
            r.moved_by_rt,
            r.outcomes_answered,
            r.outcomes_unanswered,
            r.outcomes_unjudged,
            r.ejections,
            r.panics,
            r.excused_answered_later,
            r.excused_switch_behind,
            r.redispatched,
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn measured(arm: &str, phase: &str) -> Row {
        Row {
            arm: arm.to_owned(),
            phase: phase.to_owned(),
            clients_used: 3,
            iperf_max_bps: Some(2e9),
            iperf_bytes: Some(1_000_000_000),
            iperf_secs: Some(4.0),
            ping_rtt_avg_ms: Some(0.4),
            ping_loss_pct: Some(0.0),
            ..Row::default()
        }
    }

    /// A failed iperf3 is "—" in the Markdown and empty in the CSV (read back as missing),
    /// never 0, and the report counts it.
    #[test]
    fn failed_measurements_show_as_missing_and_are_counted() {
        let mut n = measured("none", "normal");
        n.derive(None);
        let mut h = Row {
            iperf_max_bps: None,
            iperf_bytes: None,
            iperf_secs: None,
            clients_failed: 1,
            ..measured("none", "heavy")
        };
        h.derive(Some(&n));
        let rows = [n, h];
        let md = markdown("case-a", &rows);
        let line = md
            .lines()
            .find(|l| l.starts_with("| none | heavy | "))
            .unwrap_or_default();
        assert_eq!(
            line, "| none | heavy | — | — | — | — | — | 0.200 | — | — |",
            "{md}"
        );
        assert!(
            md.contains("**Failed measurements: 2** — iperf3 gave no result in 1 of 2 rows, ping no round-trip time in 0 of 2, 1 of 6 load clients no report"),
            "{md}"
        );
        let text = csv(&rows);
        let back = parse_csv(&text).expect("CSV parses");
        assert_eq!(back[1].iperf_max_bps, None);
        assert_eq!(back[1].isl_pct, None);
        assert_eq!(back[0].bdmax_gbps, Some(2.0));
        let col = COLUMNS.iter().position(|c| *c == "bdmax_gbps").unwrap_or(0);
        let heavy: Vec<&str> = text.lines().nth(2).unwrap_or_default().split(',').collect();
        assert_eq!(heavy[col], "");
        assert!(failures(&rows[..1]).is_none());
    }

    #[test]
    fn isslm_moves_are_in_the_table_and_the_csv() {
        let mut r = measured("isslm", "heavy");
        (r.moved_by_load, r.moved_by_conns, r.moved_by_rt) = (3, 1, 0);
        let rows = [r];
        let md = markdown("case-b", &rows);
        assert!(md.contains("| 3/1/0 |"), "{md}");
        let back = parse_csv(&csv(&rows)).expect("CSV parses");
        let got = (
            back[0].moved_by_load,
            back[0].moved_by_conns,
            back[0].moved_by_rt,
        );
        assert_eq!(got, (3, 1, 0));
    }

    #[test]
    fn outlier_detection_is_in_the_table_and_the_csv() {
        let mut r = measured("isslm", "heavy");
        (r.ejections, r.panics) = (2, 1);
        (r.excused_answered_later, r.excused_switch_behind) = (40, 3);
        r.redispatched = 12;
        (
            r.outcomes_answered,
            r.outcomes_unanswered,
            r.outcomes_unjudged,
        ) = (900, 95, 7);
        let rows = [r];
        let md = markdown("case-d", &rows);
        assert!(
            md.contains("| 900 / 95 / 7 | 2 / 1 | 40 / 3 | 12 |"),
            "{md}"
        );
        let back = parse_csv(&csv(&rows)).expect("CSV parses");
        let got = (
            back[0].ejections,
            back[0].panics,
            back[0].excused_answered_later,
            back[0].excused_switch_behind,
            back[0].outcomes_answered,
            back[0].outcomes_unanswered,
            back[0].outcomes_unjudged,
            back[0].redispatched,
        );
        assert_eq!(got, (2, 1, 40, 3, 900, 95, 7, 12));
    }

    #[test]
    fn columns_follow_the_row() {
        let v = serde_json::to_value(Row::default()).unwrap_or_default();
        let keys: Vec<&str> = v
            .as_object()
            .map(|m| m.keys().map(String::as_str).collect())
            .unwrap_or_default();
        let mut cols = COLUMNS.to_vec();
        cols.sort_unstable();
        let mut keys = keys;
        keys.sort_unstable();
        assert_eq!(cols, keys);
    }
}
