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
    "wall_s",
    "sent",
    "ok",
    "failed",
    "http_503",
    "timeouts",
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
            let val = if v.is_empty() {
                serde_json::Value::Null
            } else if let Ok(n) = v.parse::<u64>() {
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

fn opt(v: Option<f64>) -> String {
    v.map(|v| format!("{v:.2}")).unwrap_or_else(|| "–".into())
}

/// The QoS table (the paper's columns) and the HTTP table, as Markdown.
pub fn markdown(scenario: &str, rows: &[Row]) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "#### {scenario}: QoS (the paper's measures)\n");
    let _ = writeln!(
        s,
        "| arm | phase | B_d(max) Gb/s | T_h Gb/s | D_Transfer GB | %I_SL | %D_Transfer | D_E-E ms | Delay_Tx ms | ΔDelay_Tx ms |"
    );
    let _ = writeln!(s, "|---|---|---|---|---|---|---|---|---|---|");
    for r in rows {
        let _ = writeln!(
            s,
            "| {} | {} | {:.3} | {:.3} | {:.3} | {} | {} | {:.3} | {:.1} | {} |",
            r.arm,
            r.phase,
            r.bdmax_gbps,
            r.th_gbps,
            r.dtransfer_gb,
            opt(r.isl_pct),
            opt(r.dtransfer_pct),
            r.de2e_ms,
            r.tx_delay_ms,
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
        "| arm | phase | offered | ok | failed (503 / timeout) | ok/s | p50 ms | p95 ms | p99 ms | srv1 | srv2 | srv3 | srv4 | Jain | controller picks 1/2/3/4 | no optimal |"
    );
    let _ = writeln!(
        s,
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
    );
    for r in rows {
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} ({} / {}) | {:.0} | {:.1} | {:.1} | {:.1} | {} | {} | {} | {} | {:.3} | {}/{}/{}/{} | {} |",
            r.arm,
            r.phase,
            r.offered,
            r.ok,
            r.failed,
            r.http_503,
            r.timeouts,
            r.ok_rps,
            r.lat_p50_ms,
            r.lat_p95_ms,
            r.lat_p99_ms,
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
        );
    }
    s
}
