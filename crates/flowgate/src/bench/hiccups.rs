//! The host's hiccups: how long a thread that does nothing but read the clock goes
//! without running (jHiccup's method, one busy thread per CPU).
//!
//! A latency target of 100 µs at the 99th percentile asks that fewer than 1 % of setups
//! wait longer. Whatever stops a CPU for longer than that (the hypervisor running another
//! guest, an interrupt storm, a long kernel path) delays every setup that arrives
//! meanwhile, and at half a controller's peak the backlog then takes as long again to
//! clear. So a machine whose CPUs spend more than about half a percent of their time in
//! gaps over 100 µs cannot show that p99 for any controller, however cheap its work.
//! `/proc/stat`'s steal does not show it: on this project's VMs it counted 10–20 ms over
//! 5 s in which a busy loop lost 128–179 ms in gaps over 20 µs. The controller bench
//! samples the machine with this meter before each run, and `flowgate bench hiccups`
//! measures it on its own.

use std::time::{Duration, Instant};

use super::Table;

/// The gap lengths counted: a gap counts under each bound it reaches.
pub const BOUNDS: [Duration; 4] = [
    Duration::from_micros(20),
    Duration::from_micros(100),
    Duration::from_millis(1),
    Duration::from_millis(10),
];

/// What one CPU's busy thread saw over `span`.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct Hiccups {
    pub cpu: usize,
    pub span: Duration,
    /// Gaps at least as long as each of [`BOUNDS`].
    pub gaps: [u64; BOUNDS.len()],
    /// The time spent in those gaps, for each bound.
    pub lost: [Duration; BOUNDS.len()],
    pub longest: Duration,
    /// Times this guest's own scheduler took the CPU from the busy thread
    /// (`nonvoluntary_ctxt_switches`; `None` where the kernel does not say). Few against
    /// many gaps: the gaps are the host's (or interrupts'), not another task's.
    pub switched_out: Option<u64>,
}

impl Hiccups {
    /// The share of the span spent in gaps of at least `BOUNDS[i]`, in percent.
    pub fn percent_lost(&self, i: usize) -> f64 {
        let lost = self.lost.get(i).copied().unwrap_or_default();
        100.0 * lost.as_secs_f64() / self.span.as_secs_f64().max(1e-9)
    }

    /// "CPU 0: 2.8 % of the time in gaps over 20 µs, 0.9 % over 100 µs; 23 gaps over
    /// 1 ms, the longest 4.1 ms".
    pub fn sentence(&self) -> String {
        let long = self.gaps[2];
        let mut s = format!(
            "CPU {}: {:.1} % of the time in gaps over 20 µs, {:.1} % over 100 µs; {long} {} over 1 ms, the longest {}",
            self.cpu,
            self.percent_lost(0),
            self.percent_lost(1),
            if long == 1 { "gap" } else { "gaps" },
            fmt_gap(self.longest)
        );
        match self.switched_out {
            Some(1) => s += "; switched out by this machine's scheduler once",
            Some(n) => s += &format!("; switched out by this machine's scheduler {n} times"),
            None => {}
        }
        s
    }
}

fn fmt_gap(d: Duration) -> String {
    if d >= Duration::from_millis(1) {
        format!("{:.1} ms", d.as_secs_f64() * 1e3)
    } else {
        format!("{} µs", d.as_micros())
    }
}

/// Counts the gaps between successive clock reads of a thread.
#[derive(Debug)]
pub struct Meter {
    start: Instant,
    last: Instant,
    seen: Hiccups,
}

impl Meter {
    pub fn new(cpu: usize, start: Instant) -> Meter {
        Meter {
            start,
            last: start,
            seen: Hiccups {
                cpu,
                ..Hiccups::default()
            },
        }
    }

    /// The thread read the clock again.
    #[inline]
    pub fn tick(&mut self, now: Instant) {
        let gap = now.saturating_duration_since(self.last);
        self.last = now;
        if gap < BOUNDS[0] {
            return;
        }
        for ((bound, n), lost) in BOUNDS
            .iter()
            .zip(&mut self.seen.gaps)
            .zip(&mut self.seen.lost)
        {
            if gap >= *bound {
                *n += 1;
                *lost += gap;
            }
        }
        self.seen.longest = self.seen.longest.max(gap);
    }

    pub fn finish(mut self) -> Hiccups {
        self.seen.span = self.last.saturating_duration_since(self.start);
        self.seen
    }
}

/// Busy-read the clock for `span` on the calling thread.
fn spin(cpu: usize, span: Duration) -> Hiccups {
    let switched_before = involuntary_switches();
    let start = Instant::now();
    let mut meter = Meter::new(cpu, start);
    loop {
        let now = Instant::now();
        meter.tick(now);
        if now.saturating_duration_since(start) >= span {
            let mut seen = meter.finish();
            seen.switched_out = involuntary_switches()
                .zip(switched_before)
                .map(|(b, a)| b.saturating_sub(a));
            return seen;
        }
    }
}

/// The calling thread's involuntary context switches so far.
fn involuntary_switches() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/thread-self/status").ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("nonvoluntary_ctxt_switches:"))
        .and_then(|v| v.trim().parse().ok())
}

/// The machine's online CPUs (`/sys/devices/system/cpu/online`, e.g. "0-1,4").
pub fn online_cpus() -> anyhow::Result<Vec<usize>> {
    let path = "/sys/devices/system/cpu/online";
    let text = std::fs::read_to_string(path).map_err(|e| anyhow::anyhow!("{path}: {e}"))?;
    parse_cpu_list(text.trim()).ok_or_else(|| anyhow::anyhow!("{path}: cannot read {text:?}"))
}

/// "0-3,6" → [0, 1, 2, 3, 6] (the kernel's cpulist format).
pub fn parse_cpu_list(s: &str) -> Option<Vec<usize>> {
    let mut cpus = Vec::new();
    for part in s.split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b) = (a.parse::<usize>().ok()?, b.parse::<usize>().ok()?);
                if b < a || b - a > 4096 {
                    return None;
                }
                cpus.extend(a..=b);
            }
            None => cpus.push(part.parse().ok()?),
        }
    }
    (!cpus.is_empty()).then_some(cpus)
}

/// Measure each of `cpus` at once for `span`, a busy thread pinned to each: their gaps
/// are those of that span, side by side. A CPU this process may not run on is an error.
pub fn measure(cpus: &[usize], span: Duration) -> anyhow::Result<Vec<Hiccups>> {
    std::thread::scope(|s| {
        let threads: Vec<_> = cpus
            .iter()
            .map(|&cpu| {
                s.spawn(move || -> anyhow::Result<Hiccups> {
                    let mut set = rustix::thread::CpuSet::new();
                    set.set(cpu);
                    rustix::thread::sched_setaffinity(None, &set)
                        .map_err(|e| anyhow::anyhow!("run on CPU {cpu}: {e}"))?;
                    Ok(spin(cpu, span))
                })
            })
            .collect();
        threads
            .into_iter()
            .map(|t| {
                t.join()
                    .map_err(|_| anyhow::anyhow!("a hiccup thread panicked"))?
            })
            .collect()
    })
}

#[derive(Debug, Clone, clap::Args)]
pub struct HiccupsArgs {
    /// Seconds to measure.
    #[arg(long, default_value_t = 5.0, value_parser = secs)]
    pub secs: f64,
    /// CPUs to measure, at once (the kernel's list format, e.g. "0-1"); all online CPUs
    /// by default.
    #[arg(long)]
    pub cpus: Option<String>,
    /// Write the results table here (Markdown).
    #[arg(long)]
    pub out: Option<std::path::PathBuf>,
}

fn secs(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(x) if x.is_finite() && x > 0.0 && x <= 3600.0 => Ok(x),
        _ => Err(format!("{s:?} is not a number of seconds in (0, 3600]")),
    }
}

pub fn run(args: &HiccupsArgs) -> anyhow::Result<Vec<Hiccups>> {
    let cpus = match &args.cpus {
        Some(list) => parse_cpu_list(list)
            .ok_or_else(|| anyhow::anyhow!("--cpus {list:?}: not a CPU list like \"0-1,3\""))?,
        None => online_cpus()?,
    };
    measure(&cpus, Duration::from_secs_f64(args.secs))
}

pub fn table(seen: &[Hiccups]) -> Table {
    let mut t = Table::new(&[
        "CPU",
        "measured s",
        "time in gaps ≥ 20 µs",
        "≥ 100 µs",
        "≥ 1 ms",
        "gaps ≥ 20 µs",
        "≥ 100 µs",
        "≥ 1 ms",
        "≥ 10 ms",
        "longest",
        "switched out by this machine's scheduler",
    ]);
    for h in seen {
        let mut row = vec![h.cpu.to_string(), format!("{:.2}", h.span.as_secs_f64())];
        row.extend((0..3).map(|i| format!("{:.2} %", h.percent_lost(i))));
        row.extend(h.gaps.iter().map(u64::to_string));
        row.push(fmt_gap(h.longest));
        row.push(h.switched_out.map_or("–".into(), |n| n.to_string()));
        t.row(row);
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    fn us(n: u64) -> Duration {
        Duration::from_micros(n)
    }

    #[test]
    fn gaps_count_under_every_bound_they_reach() {
        let t0 = Instant::now();
        let mut m = Meter::new(3, t0);
        // 1 µs steps, then gaps of 19 µs (not one), 20 µs, 150 µs, 2 ms and 12 ms.
        let mut t = t0;
        for step in [1, 1, 19, 20, 1, 150, 2_000, 1, 12_000, 1] {
            t += us(step);
            m.tick(t);
        }
        let h = m.finish();
        assert_eq!(h.cpu, 3);
        assert_eq!(h.span, t - t0);
        assert_eq!(h.gaps, [4, 3, 2, 1]);
        assert_eq!(h.lost, [us(14_170), us(14_150), us(14_000), us(12_000)]);
        assert_eq!(h.longest, us(12_000));
        let share = 100.0 * 14_150.0 / (t - t0).as_micros() as f64;
        assert!((h.percent_lost(1) - share).abs() < 1e-9);
        assert!(h.sentence().starts_with("CPU 3: "), "{}", h.sentence());
        assert!(
            h.sentence()
                .ends_with("2 gaps over 1 ms, the longest 12.0 ms")
        );
    }

    #[test]
    fn a_clock_that_steps_back_is_no_gap() {
        let t0 = Instant::now() + us(1_000);
        let mut m = Meter::new(0, t0);
        m.tick(t0 - us(500));
        m.tick(t0 - us(499));
        let h = m.finish();
        assert_eq!(h.gaps, [0; 4]);
        assert_eq!(h.span, Duration::ZERO);
    }

    #[test]
    fn cpu_lists_read_as_the_kernel_writes_them() {
        assert_eq!(parse_cpu_list("0-1"), Some(vec![0, 1]));
        assert_eq!(parse_cpu_list("0,2-4,7"), Some(vec![0, 2, 3, 4, 7]));
        assert_eq!(parse_cpu_list("5"), Some(vec![5]));
        for bad in ["", "a", "3-1", "1-", "0-99999"] {
            assert_eq!(parse_cpu_list(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn a_busy_thread_is_measured_over_its_span() {
        let h = measure(&[online_cpus().expect("online CPUs")[0]], us(20_000)).expect("measure");
        assert_eq!(h.len(), 1);
        assert!(h[0].span >= us(20_000), "{:?}", h[0]);
        assert!(
            h[0].lost[0] <= h[0].span && h[0].longest <= h[0].span,
            "{:?}",
            h[0]
        );
        assert!(h[0].switched_out.is_some(), "Linux counts them: {:?}", h[0]);
    }
}
