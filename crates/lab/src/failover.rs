//! Case C's fault tolerance, measured: `flowgate lab run case-c --failover`.
//!
//! The paper gives Case C two higher-level controllers, C_p1 and C_p2, "responsible for
//! overall network flow control management and fault tolerance", and measures neither.
//! Here a third phase runs the heavy phase's load twice more (the same clients, the same
//! schedule: the same seed): first as a control with nothing killed, then with the active
//! global controller C_p1 killed (SIGKILL, no goodbye) a quarter of the way in. Its lease
//! expires and the standby C_p2 takes over. The control runs in the state the heavy
//! phase left the machine in, as the killed pass does: a heavy pass is no control at full
//! size, where every pass after the first starts behind it. What the phase shows:
//!
//! - **The takeover:** from the kill to C_p2's leadership (its own
//!   `leader_since_unix_ms`), bounded by the lease (`lease_ttl_ms`, 2 s in the lab).
//! - **The spills:** which domains spilled when C_p1 died, and whether any of them was
//!   seen not spilling from the kill to a second after the takeover (the domains keep
//!   the decisions they read, and the new active controller starts from those in the
//!   store; `docs/distributed.md`, "Failover").
//! - **The requests,** in three windows of the pass (before the kill, no active global
//!   controller, after the takeover), each beside the same window of the control pass.
//!   The domains decide every connection themselves; a failover should cost nothing a
//!   domain sees.
//!
//! The parts here are pure (parsing the runs' request logs, windows, the spill timeline);
//! [`Killer`] is the one thread that acts.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, anyhow, bail};
use serde::{Deserialize, Serialize};

use crate::ctl::http_get;
use crate::measure::quantile;

/// How far into its pass C_p1 is killed: a quarter, leaving most of the pass to see the
/// takeover (about the lease, 2 s) and what follows it.
pub const KILL_AT: f64 = 0.25;
/// How long after the takeover a spill in force must still be seen, to count as kept.
pub const HELD_AFTER_MS: u64 = 1000;
/// The window from the kill to the takeover.
pub const GAP: &str = "no active global";
/// How long the standby may take before the lab calls the takeover missing.
const TAKEOVER_LIMIT: Duration = Duration::from_secs(15);

/// What the failover phase measured (in the run's JSON as `failover`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Failover {
    /// Seconds into the killed pass at which C_p1 was killed.
    pub killed_at_s: f64,
    /// From the kill to C_p2's leadership, ms; `None` when it had not taken over within
    /// 15 s.
    pub takeover_ms: Option<u64>,
    /// Domains (`d1`..`d4`) whose spill was in force at the last sample before the kill.
    pub spilling_at_kill: Vec<String>,
    /// Of those, the domains seen not spilling at some sample from the kill to
    /// [`HELD_AFTER_MS`] after the takeover (or to the phase's end, with no takeover).
    pub spill_dropped: Vec<String>,
    /// Samples of the domains' spill between the kill and that end (every 250 ms).
    pub samples_in_gap: usize,
    /// The phase's requests in three windows, each beside the same window of its control
    /// pass (`pass` "control", then "failover").
    pub windows: Vec<Window>,
}

/// The requests due in one window of one pass, over the four domains.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Window {
    /// `control` (nothing killed) or `failover`.
    pub pass: String,
    /// `before the kill`, `no active global` or `after the takeover`.
    pub window: String,
    /// Seconds into the pass.
    pub from_s: f64,
    pub to_s: f64,
    /// Requests due in the window.
    pub due: u64,
    /// Answered 200.
    pub ok: u64,
    /// Anything else (503, a timeout, a reset...).
    pub failed: u64,
    /// Answered 200 by another domain's server (spilled).
    pub spilled_ok: u64,
    /// Of the ok requests.
    pub p99_ms: Option<f64>,
}

/// One request of a run's request log (`measure::wait_loads`).
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    /// When it was due, Unix seconds.
    pub due_unix: f64,
    pub ok: bool,
    pub ms: f64,
    /// Answered by a server other than its domain's own.
    pub spilled: bool,
}

/// Parses a domain's request log: `CLIENT PORT BACKEND STATUS|ERROR MS UNIX_SECS` a line.
/// `own` is the domain's own server's name (`srv1`...). The error in the middle is read
/// whole, whatever it holds; MS and UNIX_SECS are the last two fields.
pub fn parse_requests(text: &str, own: &str) -> Result<Vec<Request>> {
    let mut out = Vec::new();
    for (i, line) in text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
    {
        let f: Vec<&str> = line.split_whitespace().collect();
        let bad = || anyhow!("request log line {}: `{line}`", i + 1);
        if f.len() < 6 {
            return Err(bad());
        }
        let n = f.len();
        let ms: f64 = f[n - 2].parse().map_err(|_| bad())?;
        let due_unix: f64 = f[n - 1].parse().map_err(|_| bad())?;
        let ok = n == 6 && f[3] == "200";
        out.push(Request {
            due_unix,
            ok,
            ms,
            spilled: ok && f[2] != own,
        });
    }
    Ok(out)
}

/// A list of domains as the reports write it: `d1, d3`, or `none`.
pub fn domains(v: &[String]) -> String {
    if v.is_empty() {
        "none".to_owned()
    } else {
        v.join(", ")
    }
}

/// The three windows' bounds, seconds into a pass of `secs`: the kill, the takeover (the
/// phase's end when there was none).
pub fn bounds(
    killed_at_s: f64,
    takeover_ms: Option<u64>,
    secs: f64,
) -> [(&'static str, f64, f64); 3] {
    let back = takeover_ms.map_or(secs, |ms| (killed_at_s + ms as f64 / 1000.0).min(secs));
    [
        ("before the kill", 0.0, killed_at_s),
        (GAP, killed_at_s, back),
        ("after the takeover", back, secs),
    ]
}

/// The requests of a pass that began at `start_unix`, in each window of `bounds`. A
/// request due after the last bound (a client that started late) counts in the last
/// window; one due before the pass, in the first.
pub fn windows(
    pass: &str,
    requests: &[Request],
    start_unix: f64,
    bounds: &[(&'static str, f64, f64); 3],
) -> Vec<Window> {
    let mut out: Vec<Window> = bounds
        .iter()
        .map(|&(name, from_s, to_s)| Window {
            pass: pass.to_owned(),
            window: name.to_owned(),
            from_s,
            to_s,
            due: 0,
            ok: 0,
            failed: 0,
            spilled_ok: 0,
            p99_ms: None,
        })
        .collect();
    let mut lat: Vec<Vec<f64>> = vec![Vec::new(); out.len()];
    for r in requests {
        let at = r.due_unix - start_unix;
        let i = bounds
            .iter()
            .rposition(|&(_, from, _)| at >= from)
            .unwrap_or(0);
        let w = &mut out[i];
        w.due += 1;
        if r.ok {
            w.ok += 1;
            w.spilled_ok += u64::from(r.spilled);
            lat[i].push(r.ms);
        } else {
            w.failed += 1;
        }
    }
    for (w, mut l) in out.iter_mut().zip(lat) {
        l.sort_by(f64::total_cmp);
        w.p99_ms = quantile(&l, 0.99);
    }
    out
}

/// One sample of the domains' spills: Unix ms, and whether each domain (d1..d4) had a
/// spill in force.
pub type SpillSample = (u64, Vec<bool>);

/// The domains spilling at the last sample before `killed_ms`, and those of them seen not
/// spilling at a sample from `killed_ms` to `until_ms`; also how many samples that span
/// had.
pub fn spills_across(
    samples: &[SpillSample],
    killed_ms: u64,
    until_ms: u64,
) -> (Vec<String>, Vec<String>, usize) {
    let name = |d: usize| format!("d{}", d + 1);
    let before: Vec<usize> = samples
        .iter()
        .rev()
        .find(|(t, _)| *t < killed_ms)
        .map(|(_, s)| (0..s.len()).filter(|&d| s[d]).collect())
        .unwrap_or_default();
    let gap: Vec<&SpillSample> = samples
        .iter()
        .filter(|(t, _)| (killed_ms..=until_ms).contains(t))
        .collect();
    let dropped = before
        .iter()
        .copied()
        .filter(|&d| gap.iter().any(|(_, s)| !s.get(d).copied().unwrap_or(false)))
        .map(name)
        .collect();
    (before.into_iter().map(name).collect(), dropped, gap.len())
}

impl Failover {
    /// The Markdown section of the run's report.
    pub fn markdown(&self) -> String {
        let fmt = |v: Option<f64>| v.map_or_else(|| "–".to_owned(), |x| format!("{x:.1}"));
        let spills = if self.spilling_at_kill.is_empty() {
            format!(
                "No domain was spilling when it died, so none had a spill to lose ({} samples of the four domains from the kill to {HELD_AFTER_MS} ms after the takeover, every 250 ms).",
                self.samples_in_gap
            )
        } else {
            format!(
                "Domains spilling when it died: {}; of them, seen not spilling from the kill to {HELD_AFTER_MS} ms after the takeover: {} ({} samples of the four domains in that span, every 250 ms).",
                self.spilling_at_kill.join(", "),
                domains(&self.spill_dropped),
                self.samples_in_gap
            )
        };
        let mut s = format!(
            "#### Failover of the global controller (`--failover`)\n\nA third phase ran the heavy phase's load twice more (the same clients and schedule): a control pass with nothing killed, then a pass in which the active global controller C_p1 was killed (SIGKILL) {:.2} s in. The phase's rows are the second pass's. {}\n\n{spills}\n\nRequests due in each window, summed over the four domains, in the control pass and in the pass with the kill:\n\n| window | s into the pass | pass | due | ok | failed | spilled ok | p99 ms |\n| --- | --- | --- | --- | --- | --- | --- | --- |\n",
            self.killed_at_s,
            match self.takeover_ms {
                Some(ms) => format!("The standby C_p2 was active {ms} ms after the kill."),
                None => "The standby C_p2 had not taken over 15 s after the kill.".to_owned(),
            },
        );
        let mut sorted: Vec<&Window> = self.windows.iter().collect();
        // Each window's control line, then its failover line.
        sorted.sort_by(|a, b| a.from_s.total_cmp(&b.from_s).then(a.pass.cmp(&b.pass)));
        for w in sorted {
            s += &format!(
                "| {} | {:.2}–{:.2} | {} | {} | {} | {} | {} | {} |\n",
                w.window,
                w.from_s,
                w.to_s,
                w.pass,
                w.due,
                w.ok,
                w.failed,
                w.spilled_ok,
                fmt(w.p99_ms)
            );
        }
        s
    }
}

/// Kills the active global controller at a set time into a pass and waits for its
/// standby to take over, on its own thread so the pass runs meanwhile. Dropped before the
/// kill (the pass failed), it kills nothing: the controller's process is then stopped and
/// reaped by its owner, and its process group id could name another's.
pub struct Killer {
    handle: Option<JoinHandle<Result<Kill>>>,
    cancel: Arc<AtomicBool>,
}

/// When the kill happened and when the standby took over, Unix ms.
#[derive(Debug, Clone, Copy)]
pub struct Kill {
    pub killed_unix_ms: u64,
    pub takeover_unix_ms: Option<u64>,
}

/// `t` in Unix milliseconds.
pub fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

impl Killer {
    /// At `after`, sends SIGKILL to process group `pgid` (the active global controller),
    /// then polls `standby`'s `/api/v1/cluster` every 50 ms until it says it is active.
    pub fn start(pgid: u32, after: Duration, standby: SocketAddr) -> Killer {
        let cancel = Arc::new(AtomicBool::new(false));
        let cancelled = cancel.clone();
        let handle = std::thread::spawn(move || -> Result<Kill> {
            let at = Instant::now() + after;
            while Instant::now() < at {
                crate::signal::sleep(Duration::from_millis(10).min(at - Instant::now()))?;
                if cancelled.load(Ordering::SeqCst) {
                    bail!("cancelled before the kill");
                }
            }
            let killed_unix_ms = unix_ms(SystemTime::now());
            flowgate_testbed::cmd::run("kill", &["-KILL", "--", &format!("-{pgid}")])
                .context("killing the active global controller")?;
            let deadline = Instant::now() + TAKEOVER_LIMIT;
            while Instant::now() < deadline {
                let v: serde_json::Value = http_get(standby, "/api/v1/cluster")
                    .ok()
                    .and_then(|b| serde_json::from_str(&b).ok())
                    .unwrap_or(serde_json::Value::Null);
                if v["mastership"] == "master" {
                    let since = v["leader_since_unix_ms"].as_u64();
                    return Ok(Kill {
                        killed_unix_ms,
                        // Its own record of when it won; the poll's time if it gave none.
                        takeover_unix_ms: Some(since.unwrap_or_else(|| unix_ms(SystemTime::now()))),
                    });
                }
                crate::signal::sleep(Duration::from_millis(50))?;
            }
            Ok(Kill {
                killed_unix_ms,
                takeover_unix_ms: None,
            })
        });
        Killer {
            handle: Some(handle),
            cancel,
        }
    }

    /// Waits for the kill and the takeover (or the 15 s limit).
    pub fn join(mut self) -> Result<Kill> {
        match self.handle.take().map(JoinHandle::join) {
            Some(Ok(r)) => r,
            Some(Err(_)) => bail!("the failover thread panicked"),
            None => bail!("the failover thread was already joined"),
        }
    }
}

impl Drop for Killer {
    fn drop(&mut self) {
        self.cancel.store(true, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LOG: &str = "\
100.0.0.11 40000 srv1 200 20.0 1000.100
100.0.0.11 40001 srv2 200 30.0 1000.600
100.0.0.12 - - ConnectTimeout 2000.0 1001.200
100.0.0.12 40003 srv1 503 1.0 1001.300
100.0.0.11 40004 srv1 200 10.0 1002.500
";

    #[test]
    fn request_log_lines_are_read_from_both_ends() {
        let r = parse_requests(LOG, "srv1").expect("parse");
        assert_eq!(r.len(), 5);
        assert_eq!((r[0].ok, r[0].spilled, r[0].ms), (true, false, 20.0));
        assert_eq!((r[1].ok, r[1].spilled), (true, true));
        assert_eq!((r[2].ok, r[2].due_unix), (false, 1001.2));
        // A 503 is answered, by its own server, but not ok.
        assert_eq!((r[3].ok, r[3].spilled), (false, false));
        // An error of more than one word still leaves MS and UNIX_SECS last.
        let odd = parse_requests("h 1 - Other(\"x y\") 5.0 7.5\n", "srv1").expect("parse");
        assert_eq!((odd[0].ok, odd[0].ms, odd[0].due_unix), (false, 5.0, 7.5));
        let e = parse_requests("h 1 srv1 200 fast 7.5\n", "srv1").expect_err("bad ms");
        assert!(e.to_string().contains("line 1"), "{e}");
        assert!(parse_requests("h 1 srv1 200\n", "srv1").is_err());
    }

    #[test]
    fn windows_split_a_pass_at_the_kill_and_the_takeover() {
        let r = parse_requests(LOG, "srv1").expect("parse");
        // Killed 1.0 s in, standby active 1.4 s later, a 3 s pass from Unix 1000.
        let b = bounds(1.0, Some(1400), 3.0);
        assert_eq!(b[1], ("no active global", 1.0, 2.4));
        let w = windows("failover", &r, 1000.0, &b);
        let counts: Vec<_> = w
            .iter()
            .map(|w| (w.due, w.ok, w.failed, w.spilled_ok))
            .collect();
        assert_eq!(counts, [(2, 2, 0, 1), (2, 0, 2, 0), (1, 1, 0, 0)]);
        assert_eq!(w[0].p99_ms, Some(30.0));
        assert_eq!(w[1].p99_ms, None);
        // Every request lands in exactly one window.
        assert_eq!(w.iter().map(|w| w.due).sum::<u64>(), r.len() as u64);
        // No takeover: the gap runs to the end and the last window is empty.
        let b = bounds(1.0, None, 3.0);
        let w = windows("failover", &r, 1000.0, &b);
        assert_eq!((w[1].due, w[2].due, w[2].from_s), (3, 0, 3.0));
        // A takeover later than the phase's end is cut at the end.
        assert_eq!(bounds(1.0, Some(9000), 3.0)[1].2, 3.0);
    }

    #[test]
    fn a_spill_counts_as_dropped_only_when_a_sample_in_the_gap_misses_it() {
        let s = |t: u64, v: [bool; 4]| (t, v.to_vec());
        let samples = vec![
            s(900, [true, false, false, false]),
            s(1000, [true, false, true, false]),
            s(1250, [true, false, true, false]),
            s(1500, [true, false, false, false]),
            s(1750, [true, true, true, false]),
            s(4000, [false, false, false, false]),
        ];
        // Killed at 1100: d1 and d3 spilled; d3 missed one sample of the three up to 1750
        // (d2 started spilling later: not counted); the sample at 4000 is past the span.
        let (at_kill, dropped, n) = spills_across(&samples, 1100, 1750);
        assert_eq!(at_kill, ["d1", "d3"]);
        assert_eq!(dropped, ["d3"]);
        assert_eq!(n, 3);
        // No sample before the kill: nothing was spilling that could be dropped.
        assert_eq!(spills_across(&samples, 100, 5000), (vec![], vec![], 6));
    }

    #[test]
    fn the_report_pairs_each_window_with_the_control_pass() {
        let r = parse_requests(LOG, "srv1").expect("parse");
        let b = bounds(1.0, Some(1400), 3.0);
        let mut windows_all = windows("control", &r, 1000.0, &b);
        windows_all.extend(windows("failover", &r, 1000.0, &b));
        let f = Failover {
            killed_at_s: 1.0,
            takeover_ms: Some(1400),
            spilling_at_kill: vec!["d1".into(), "d3".into()],
            spill_dropped: vec!["d3".into()],
            samples_in_gap: 8,
            windows: windows_all,
        };
        let md = f.markdown();
        assert!(md.contains("active 1400 ms after the kill"), "{md}");
        assert!(md.contains("Domains spilling when it died: d1, d3; of them, seen not spilling from the kill to 1000 ms after the takeover: d3 (8 samples"), "{md}");
        let lines: Vec<&str> = md
            .lines()
            .filter(|l| {
                l.starts_with("| ") && !l.starts_with("| window") && !l.starts_with("| ---")
            })
            .collect();
        assert_eq!(lines.len(), 6, "{md}");
        assert!(
            lines[0]
                .starts_with("| before the kill | 0.00–1.00 | control | 2 | 2 | 0 | 1 | 30.0 |"),
            "{md}"
        );
        assert!(lines[1].contains("| failover |"), "{md}");
        assert!(
            lines[3].starts_with("| no active global | 1.00–2.40 | failover | 2 | 0 | 2 | 0 | – |"),
            "{md}"
        );
        let calm = Failover {
            spilling_at_kill: vec![],
            spill_dropped: vec![],
            takeover_ms: None,
            ..f.clone()
        }
        .markdown();
        assert!(
            calm.contains(
                "No domain was spilling when it died, so none had a spill to lose (8 samples"
            ),
            "{calm}"
        );
        assert!(
            calm.contains("had not taken over 15 s after the kill"),
            "{calm}"
        );
        // Round trip through the run's JSON.
        let back: Failover =
            serde_json::from_str(&serde_json::to_string(&f).expect("json")).expect("read");
        assert_eq!(back, f);
    }
}
