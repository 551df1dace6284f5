//! The runs' tables (Markdown and CSV) and plots (SVG).

use std::fmt::Write as _;
use std::path::Path;

use flowgate_lab::plot;

use crate::{Outcome, PhaseStats, Scenario};

const HEADER: [&str; 18] = [
    "algorithm",
    "overload",
    "outlier",
    "redispatch",
    "load",
    "offered",
    "served %",
    "reset by controller %",
    "refused by server %",
    "timed out %",
    "lost",
    "SYN drops at switch",
    "p50 ms",
    "p99 ms",
    "server util mean",
    "server util max",
    "util CoV",
    "controller util",
];

fn pct(n: u64, of: u64) -> f64 {
    if of == 0 {
        0.0
    } else {
        100.0 * n as f64 / of as f64
    }
}

/// One row per run and phase.
pub fn rows(runs: &[Outcome]) -> Vec<Vec<String>> {
    let mut v = Vec::new();
    for r in runs {
        for p in &r.phases {
            v.push(vec![
                r.algorithm.clone(),
                r.overload.clone(),
                r.outlier.clone(),
                on_off(r.redispatch).into(),
                format!("{:.2}", p.load),
                p.offered.to_string(),
                format!("{:.2}", pct(p.served, p.offered)),
                format!("{:.2}", pct(p.reset, p.offered)),
                format!("{:.2}", pct(p.server_refused, p.offered)),
                format!("{:.2}", pct(p.timed_out + p.dropped_by_server, p.offered)),
                p.lost.to_string(),
                p.syn_drops.to_string(),
                format!("{:.1}", p.rt_p50_ms),
                format!("{:.1}", p.rt_p99_ms),
                format!("{:.3}", p.util_mean),
                format!("{:.3}", p.util_max),
                format!("{:.3}", p.util_cov),
                format!("{:.4}", p.controller_util),
            ]);
        }
    }
    v
}

/// The outlier table's columns: of each run, what its faulty servers cost and what the
/// controller's outlier detection made of them.
const OUTLIER_HEADER: [&str; 12] = [
    "algorithm",
    "overload",
    "outlier",
    "redispatch",
    "load",
    "to faulty servers %",
    "dropped by them %",
    "redispatched %",
    "faulty ejected",
    "first ejection s",
    "healthy ejected",
    "ejections by detector",
];

/// One row per run and phase, for runs with faulty servers; the ejection columns count
/// the ejections that started in the phase.
pub fn outlier_rows(sc: &Scenario, runs: &[Outcome]) -> Vec<Vec<String>> {
    let phase_s = sc.phase.as_secs_f64();
    let mut v = Vec::new();
    for r in runs.iter().filter(|r| !r.faulty.is_empty()) {
        for (i, p) in r.phases.iter().enumerate() {
            let (from, to) = (i as f64 * phase_s, (i + 1) as f64 * phase_s);
            let last = i + 1 == r.phases.len();
            // The last phase's ejections include those of the drain after it.
            let here: Vec<&crate::Ejection> = r
                .ejections
                .iter()
                .filter(|e| e.at_s >= from && (last || e.at_s < to))
                .collect();
            let mut faulty: Vec<usize> =
                here.iter().filter(|e| e.faulty).map(|e| e.server).collect();
            faulty.sort_unstable();
            faulty.dedup();
            let first = here
                .iter()
                .find(|e| e.faulty)
                .map_or_else(|| "-".to_string(), |e| format!("{:.1}", e.at_s));
            let mut by: Vec<(&str, usize)> = Vec::new();
            for e in &here {
                match by.iter_mut().find(|(d, _)| *d == e.detector) {
                    Some((_, n)) => *n += 1,
                    None => by.push((e.detector, 1)),
                }
            }
            let by = if by.is_empty() {
                "-".to_string()
            } else {
                by.iter()
                    .map(|(d, n)| format!("{d} {n}"))
                    .collect::<Vec<_>>()
                    .join("; ")
            };
            v.push(vec![
                r.algorithm.clone(),
                r.overload.clone(),
                r.outlier.clone(),
                on_off(r.redispatch).into(),
                format!("{:.2}", p.load),
                format!("{:.2}", pct(p.to_faulty, p.offered)),
                format!("{:.2}", pct(p.dropped_by_server, p.offered)),
                format!("{:.2}", pct(p.redispatched, p.offered)),
                format!("{} of {}", faulty.len(), r.faulty.len()),
                first,
                here.iter().filter(|e| !e.faulty).count().to_string(),
                by,
            ]);
        }
    }
    v
}

/// A Markdown table's header, rule and rows.
fn table(s: &mut String, header: &[&str], rows: Vec<Vec<String>>) {
    let _ = writeln!(s, "| {} |", header.join(" | "));
    let _ = writeln!(
        s,
        "|{}|",
        header.iter().map(|_| " --- ").collect::<Vec<_>>().join("|")
    );
    for r in rows {
        let _ = writeln!(s, "| {} |", r.join(" | "));
    }
}

pub fn markdown(sc: &Scenario, runs: &[Outcome]) -> String {
    let mut s = String::new();
    let sh = sc.shape;
    let _ = writeln!(
        s,
        "# flowgate sim\n\nA leaf-spine fabric of {} leaves and {} spines; {} servers ({} a leaf, {} workers each, {} ms mean service at speeds {:?} cycled, accept queue {}), {} clients. Pool capacity {:.0} requests/s. Load in phases of {} s: {:?} of capacity. Controller: {} µs a PACKET_IN ({} of it for a SYN it refuses); server load reported every {} ms. Seed {}.\n",
        sh.leaves,
        sh.spines,
        sh.servers(),
        sh.servers_per_leaf,
        sc.workers,
        sc.service.as_secs_f64() * 1e3,
        sc.speeds,
        sc.backlog,
        sh.clients(),
        sc.capacity(),
        sc.phase.as_secs_f64(),
        sc.loads,
        sc.controller_cost.as_secs_f64() * 1e6,
        sc.refusal_share,
        sc.report_every.as_secs_f64() * 1e3,
        sc.seed,
    );
    table(&mut s, &HEADER, rows(runs));
    let _ = writeln!(s);
    let outliers = outlier_rows(sc, runs);
    if !outliers.is_empty() {
        let _ = writeln!(
            s,
            "Faulty servers: {} of {} (each drops {:.0} % of its connections silently, their retransmitted SYNs too{}); connection rules idle out after {} s. Timed out % above counts their dropped connections. The ejections of each phase; the last phase's include the {} s after it.\n",
            sc.faulty,
            sh.servers(),
            sc.drop_share * 100.0,
            sc.recover_at.map_or_else(String::new, |r| format!(
                ", until they recover {:.1} s after the first request",
                r.as_secs_f64()
            )),
            sc.idle_timeout_secs,
            crate::engine::drain_secs(sc),
        );
        table(&mut s, &OUTLIER_HEADER, outliers);
        let _ = writeln!(s);
    }
    for r in runs {
        let _ = writeln!(
            s,
            "- {}: {} links and {} hosts found by the controller, {} PACKET_INs, {} connections' rules deferred to the client's ACK, at most {} connection rules on one switch, {} of {} spines carrying connections; {:.1} s of wall time.",
            name(r),
            r.links_found,
            r.hosts_learned,
            r.packet_ins,
            r.deferred,
            r.max_conn_rules,
            r.spines_used,
            sc.shape.spines,
            r.wall_secs
        );
    }
    s
}

pub fn csv(runs: &[Outcome]) -> String {
    let mut s = HEADER.join(",") + "\n";
    for r in rows(runs) {
        s += &(r.join(",") + "\n");
    }
    s
}

/// The outlier table as CSV (empty when no run has faulty servers).
pub fn outlier_csv(sc: &Scenario, runs: &[Outcome]) -> String {
    let rows = outlier_rows(sc, runs);
    if rows.is_empty() {
        return String::new();
    }
    let mut s = OUTLIER_HEADER.join(",") + "\n";
    for r in rows {
        s += &(r.join(",") + "\n");
    }
    s
}

/// Tables and plots into `dir`: `sim.md`, `sim.csv`, `sim.json`, and per load phase the
/// p99 response time and the servers' imbalance by run, and each run's goodput over time.
pub fn write(dir: &Path, sc: &Scenario, runs: &[Outcome]) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir)?;
    std::fs::write(dir.join("sim.md"), markdown(sc, runs))?;
    std::fs::write(dir.join("sim.csv"), csv(runs))?;
    let outliers = outlier_csv(sc, runs);
    if !outliers.is_empty() {
        std::fs::write(dir.join("outliers.csv"), outliers)?;
    }
    std::fs::write(
        dir.join("sim.json"),
        serde_json::to_string_pretty(&serde_json::json!({ "scenario": sc, "runs": runs }))?,
    )?;
    let served: Vec<plot::Series> = runs
        .iter()
        .map(|r| (name(r), r.series.iter().map(|s| (s.t, s.served)).collect()))
        .collect();
    plot::lines(
        &dir.join("served.svg"),
        "Requests served per second",
        "time (s)",
        "requests/s",
        &served,
    )?;
    let p99 = by_load(runs, |p| p.rt_p99_ms);
    plot::xy(
        &dir.join("p99.svg"),
        "p99 response time by offered load",
        "offered load (of capacity)",
        "ms",
        &p99,
    )?;
    let cov = by_load(runs, |p| p.util_cov);
    plot::xy(
        &dir.join("imbalance.svg"),
        "Servers' utilization, coefficient of variation",
        "offered load (of capacity)",
        "CoV",
        &cov,
    )?;
    Ok(())
}

/// A run's name (see [`run_name`]).
pub fn name(r: &Outcome) -> String {
    run_name(&r.algorithm, &r.overload, &r.outlier, r.redispatch)
}

/// The name of a run of `algorithm`, `overload` control and `outlier` detection, and
/// "no redispatch" when without it: in the tables, the plots and the command's messages.
pub fn run_name(algorithm: &str, overload: &str, outlier: &str, redispatch: bool) -> String {
    let redispatch = if redispatch { "" } else { " / no redispatch" };
    format!("{algorithm} / {overload} / {outlier}{redispatch}")
}

fn on_off(on: bool) -> &'static str {
    if on { "on" } else { "off" }
}

/// One series per run: `y` of each phase against its offered load.
fn by_load(runs: &[Outcome], y: impl Fn(&PhaseStats) -> f64) -> Vec<plot::Series> {
    runs.iter()
        .map(|r| (name(r), r.phases.iter().map(|p| (p.load, y(p))).collect()))
        .collect()
}
