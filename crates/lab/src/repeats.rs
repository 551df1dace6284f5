//! Repeated runs of a scenario: each figure's median and range over the runs.
//!
//! One run is one sample of a shared machine: in results.md two quick runs of the same
//! Case A arm differ by 2.9 points of %I_SL, more than some neighbours in Case D's order.
//! A figure is worth quoting with its spread, so `flowgate lab run NAME --runs N` runs a
//! scenario N times (seeds `seed`, `seed + 1`, ..., each run in its own directory), and
//! `flowgate lab summarize` does the same for runs made apart (other builds, other days).
//! Both read the runs' `NAME.json` and write `NAME-runs.{md,csv,json}`.
//!
//! The summary is the median with the smallest and largest value, never a mean and a
//! standard deviation: three to ten runs of a machine whose noise comes in bursts are too
//! few for a normal model, and a median and range say only what was seen.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};

use crate::failover::{self, Failover};
use crate::measure::Row;
use crate::overload::Point;
use crate::report::MISSING;

/// What a summary says of one figure: its column, header and decimals, and which Markdown
/// table of its [`Layout`] shows it (`None`: only the CSV and JSON).
#[derive(Debug, Clone, Copy)]
pub struct Spec {
    pub key: &'static str,
    pub header: &'static str,
    pub digits: usize,
    pub table: Option<usize>,
}

/// A figure and how to read it from a row of type `R`.
struct Figure<R> {
    spec: Spec,
    get: fn(&R) -> Option<f64>,
}

const fn fig<R>(
    key: &'static str,
    header: &'static str,
    digits: usize,
    table: Option<usize>,
    get: fn(&R) -> Option<f64>,
) -> Figure<R> {
    Figure {
        spec: Spec {
            key,
            header,
            digits,
            table,
        },
        get,
    }
}

#[allow(clippy::cast_precision_loss)] // request counts are far below 2^52
fn n(v: u64) -> Option<f64> {
    Some(v as f64)
}

const QOS: Option<usize> = Some(0);
const HTTP: Option<usize> = Some(1);
const CSV: Option<usize> = None;

/// The paper's cases: every figure of a row, in the order of the run's own tables.
const CASE_FIGURES: &[Figure<Row>] = &[
    fig("bdmax_gbps", "B_d(max) Gb/s", 3, QOS, |r| r.bdmax_gbps),
    fig("th_gbps", "T_h Gb/s", 3, QOS, |r| r.th_gbps),
    fig("dtransfer_gb", "D_Transfer GB", 3, QOS, |r| r.dtransfer_gb),
    fig("isl_pct", "%I_SL", 2, QOS, |r| r.isl_pct),
    fig("dtransfer_pct", "%D_Transfer", 2, QOS, |r| r.dtransfer_pct),
    fig("de2e_ms", "D_E-E ms", 3, QOS, |r| r.de2e_ms),
    fig("tx_delay_ms", "Delay_Tx ms", 1, QOS, |r| r.tx_delay_ms),
    fig("diff_delay_ms", "ΔDelay_Tx ms", 1, QOS, |r| {
        r.diff_delay_ms
    }),
    fig("ok", "ok", 0, HTTP, |r| n(r.ok)),
    fig("ok_rps", "ok/s", 0, HTTP, |r| Some(r.ok_rps)),
    fig("timeouts", "timeouts", 0, HTTP, |r| n(r.timeouts)),
    fig("http_503", "503", 0, HTTP, |r| n(r.http_503)),
    fig("lat_p50_ms", "p50 ms", 1, HTTP, |r| r.lat_p50_ms),
    fig("lat_p95_ms", "p95 ms", 1, HTTP, |r| r.lat_p95_ms),
    fig("lat_p99_ms", "p99 ms", 1, HTTP, |r| r.lat_p99_ms),
    fig("syn_retransmits", "SYNs sent again", 0, HTTP, |r| {
        r.syn_retransmits.and_then(n)
    }),
    fig("jain", "Jain", 3, HTTP, |r| Some(r.jain)),
    fig("srv1", "srv1", 0, CSV, |r| n(r.srv1)),
    fig("srv2", "srv2", 0, CSV, |r| n(r.srv2)),
    fig("srv3", "srv3", 0, CSV, |r| n(r.srv3)),
    fig("srv4", "srv4", 0, CSV, |r| n(r.srv4)),
    fig("no_optimal_server", "no optimal", 0, CSV, |r| {
        n(r.no_optimal_server)
    }),
    fig("moved_by_load", "ISSLM moves by load", 0, CSV, |r| {
        n(r.moved_by_load)
    }),
    fig("ejections", "ejections", 0, CSV, |r| n(r.ejections)),
    fig(
        "excused_answered_later",
        "silences excused as answered later",
        0,
        CSV,
        |r| n(r.excused_answered_later),
    ),
    fig("ping_loss_pct", "ping loss %", 1, CSV, |r| r.ping_loss_pct),
];

/// A point of the overload scenario with what its run measured before the points.
struct PointRow {
    point: Point,
    capacity_rps: f64,
    unloaded_p99_ms: f64,
}

const LOAD: Option<usize> = Some(0);

/// The overload scenario: each point's figures, in the order of its own table.
const OVERLOAD_FIGURES: &[Figure<PointRow>] = &[
    fig("offered_rps", "offered req/s", 1, LOAD, |r| {
        Some(r.point.offered_rps)
    }),
    fig("admitted_rps", "admitted req/s", 1, LOAD, |r| {
        Some(r.point.admitted_rps)
    }),
    fig("ctl_refused", "refused by the gap", 0, LOAD, |r| {
        n(r.point.ctl_refused)
    }),
    fig("ctl_meter_dropped", "meter drops", 0, LOAD, |r| {
        n(r.point.ctl_meter_dropped)
    }),
    fig("goodput_rps", "goodput req/s", 1, LOAD, |r| {
        Some(r.point.goodput_rps)
    }),
    fig("goodput_per_capacity", "goodput / capacity", 2, LOAD, |r| {
        (r.capacity_rps > 0.0).then(|| r.point.goodput_rps / r.capacity_rps)
    }),
    // A point that served nothing has no latency (the run writes 0).
    fig("p50_ms", "p50 ms", 1, LOAD, |r| {
        (r.point.ok > 0).then_some(r.point.p50_ms)
    }),
    fig("p99_ms", "p99 ms", 1, LOAD, |r| {
        (r.point.ok > 0).then_some(r.point.p99_ms)
    }),
    fig("p99_per_unloaded", "p99 / unloaded", 2, LOAD, |r| {
        (r.point.ok > 0 && r.unloaded_p99_ms > 0.0).then(|| r.point.p99_ms / r.unloaded_p99_ms)
    }),
    fig("refused_prompt", "refused, told at once", 0, LOAD, |r| {
        n(r.point.refused_prompt)
    }),
    fig("timeouts", "left waiting (timeouts)", 0, LOAD, |r| {
        n(r.point.timeouts)
    }),
    fig("failed_max_ms", "slowest failure ms", 1, CSV, |r| {
        (r.point.sent > r.point.ok).then_some(r.point.failed_max_ms)
    }),
    fig("capacity_rps", "capacity req/s", 1, CSV, |r| {
        Some(r.capacity_rps)
    }),
    fig("unloaded_p99_ms", "unloaded p99 ms", 1, CSV, |r| {
        Some(r.unloaded_p99_ms)
    }),
];

/// Where the arms are put in order, and by which figures (`true`: lower is better).
#[derive(Debug, Clone, Copy)]
pub struct Order {
    /// The rows whose second key is this; `None`: the largest (the overload's top load).
    pub at: Option<&'static str>,
    pub by: &'static [(&'static str, bool)],
}

/// How a scenario's rows are keyed, tabled and ordered.
#[derive(Debug, Clone)]
pub struct Layout {
    /// The names of a row's two keys: arm and phase, or mode and load.
    pub keys: [&'static str; 2],
    /// The Markdown tables' titles ([`Spec::table`] indexes them).
    pub tables: &'static [&'static str],
    pub figures: Vec<Spec>,
    pub order: Option<Order>,
    /// Whether the scenario's runs draw at random (the cases' clients, by `--seed`); the
    /// overload scenario draws nothing, so its runs differ only by the machine.
    pub seeded: bool,
}

fn specs<R>(figures: &[Figure<R>]) -> Vec<Spec> {
    figures.iter().map(|f| f.spec).collect()
}

impl Layout {
    /// The layout of `scenario`'s runs.
    pub fn of(scenario: &str) -> Layout {
        if scenario == "overload" {
            return Layout {
                keys: ["mode", "× capacity"],
                tables: &["against offered load"],
                figures: specs(OVERLOAD_FIGURES),
                order: Some(Order {
                    at: None,
                    by: &[("goodput_rps", false), ("p99_ms", true), ("timeouts", true)],
                }),
                seeded: false,
            };
        }
        let order = match scenario {
            // Case C's rows are domains, not arms: nothing to order.
            "case-c" => None,
            // No QoS pass; the arms are ordered where the fault alone is at work: the
            // normal phase, which three servers carry with room to spare.
            "faults" => Some(Order {
                at: Some("normal"),
                by: &[("ok", false), ("timeouts", true), ("lat_p99_ms", true)],
            }),
            _ => Some(Order {
                at: Some("heavy"),
                by: &[
                    ("isl_pct", true),
                    ("dtransfer_pct", true),
                    ("ok", false),
                    ("lat_p99_ms", true),
                    ("jain", false),
                ],
            }),
        };
        Layout {
            keys: ["arm", "phase"],
            tables: &["QoS (the paper's measures)", "HTTP load and servers"],
            figures: specs(CASE_FIGURES),
            order,
            seeded: true,
        }
    }

    fn spec(&self, key: &str) -> Option<&Spec> {
        self.figures.iter().find(|f| f.key == key)
    }
}

/// Median, smallest and largest of the runs that measured a figure.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Spread {
    /// Runs that measured it (a failed iperf3 or ping leaves a run out).
    pub n: usize,
    /// The middle value; with an even count, the mean of the middle two.
    pub median: f64,
    pub min: f64,
    pub max: f64,
}

impl Spread {
    /// The spread of `values`, leaving out the missing ones; `None` if none is there.
    pub fn of(values: &[Option<f64>]) -> Option<Spread> {
        let mut v: Vec<f64> = values
            .iter()
            .flatten()
            .copied()
            .filter(|x| x.is_finite())
            .collect();
        v.sort_by(f64::total_cmp);
        let (&min, &max) = (v.first()?, v.last()?);
        let mid = v.len() / 2;
        let median = if v.len() % 2 == 1 {
            v[mid]
        } else {
            f64::midpoint(v[mid - 1], v[mid])
        };
        Some(Spread {
            n: v.len(),
            median,
            min,
            max,
        })
    }

    /// `median (min–max)`, or the value alone when every run gave the same, with `digits`
    /// decimals; `[n=k]` when fewer than `runs` measured it.
    fn cell(&self, digits: usize, runs: usize) -> String {
        // Runs that differ only past the shown decimals read as the same.
        let (min, max) = (
            format!("{:.digits$}", self.min),
            format!("{:.digits$}", self.max),
        );
        let mut s = if min == max {
            format!("{:.digits$}", self.median)
        } else {
            format!("{:.digits$} ({min}–{max})", self.median)
        };
        if self.n < runs {
            let _ = write!(s, " [n={}]", self.n);
        }
        s
    }
}

/// One row of one run: its two keys and its figures' values in its [`Layout`]'s order.
#[derive(Debug, Clone)]
pub struct Sample {
    pub key: [String; 2],
    pub values: Vec<Option<f64>>,
}

fn sample<R>(key: [String; 2], row: &R, figures: &[Figure<R>]) -> Sample {
    Sample {
        key,
        values: figures.iter().map(|f| (f.get)(row)).collect(),
    }
}

/// A run's JSON as `lab run` writes it (the fields the summary reads).
#[derive(Deserialize)]
struct RunFile {
    scenario: String,
    quick: bool,
    /// Missing in runs written before the seed was recorded.
    #[serde(default)]
    seed: Option<u64>,
    #[serde(default)]
    rows: Vec<Row>,
    #[serde(default)]
    overload: Option<OverloadFile>,
    #[serde(default)]
    failover: Option<Failover>,
}

#[derive(Deserialize)]
struct OverloadFile {
    capacity_rps: f64,
    unloaded_p99_ms: f64,
    points: Vec<Point>,
}

/// One run, as the summary reads it.
#[derive(Debug, Clone)]
pub struct Run {
    pub scenario: String,
    pub quick: bool,
    pub seed: Option<u64>,
    pub samples: Vec<Sample>,
    /// Case C's failover phase (`--failover`), if it ran.
    pub failover: Option<Failover>,
    /// The file it was read from.
    pub path: PathBuf,
}

impl Run {
    /// Reads a run's JSON, or the one `NAME.json` of a run's directory.
    pub fn read(path: &Path) -> Result<Run> {
        let file = if path.is_dir() {
            let found: Vec<PathBuf> = std::fs::read_dir(path)
                .with_context(|| format!("reading {}", path.display()))?
                .flatten()
                .map(|e| e.path())
                .filter(|p| {
                    p.file_stem()
                        .and_then(|n| n.to_str())
                        .is_some_and(|n| crate::scenario::find(n).is_some())
                        && p.extension().is_some_and(|e| e == "json")
                })
                .collect();
            match found.as_slice() {
                [one] => one.clone(),
                [] => bail!(
                    "{}: no NAME.json of a scenario (a lab run's directory has one)",
                    path.display()
                ),
                _ => bail!("{}: several NAME.json; name the file", path.display()),
            }
        } else {
            path.to_owned()
        };
        let text = std::fs::read_to_string(&file)
            .with_context(|| format!("reading {}", file.display()))?;
        Run::parse(&text, file.clone()).with_context(|| format!("{}", file.display()))
    }

    /// A run from the text of its JSON; `path` names it in messages.
    pub fn parse(text: &str, path: PathBuf) -> Result<Run> {
        Run::from_file(
            serde_json::from_str(text).context("not a lab run's JSON")?,
            path,
        )
    }

    fn from_file(f: RunFile, path: PathBuf) -> Result<Run> {
        let samples: Vec<Sample> = match &f.overload {
            Some(o) => o
                .points
                .iter()
                .map(|p| {
                    let row = PointRow {
                        point: p.clone(),
                        capacity_rps: o.capacity_rps,
                        unloaded_p99_ms: o.unloaded_p99_ms,
                    };
                    sample(
                        [p.mode.clone(), p.multiple.to_string()],
                        &row,
                        OVERLOAD_FIGURES,
                    )
                })
                .collect(),
            None => f
                .rows
                .iter()
                .map(|r| sample([r.arm.clone(), r.phase.clone()], r, CASE_FIGURES))
                .collect(),
        };
        if samples.is_empty() {
            bail!("a run with no rows");
        }
        Ok(Run {
            scenario: f.scenario,
            quick: f.quick,
            seed: f.seed,
            samples,
            failover: f.failover,
            path,
        })
    }
}

/// One figure over the runs.
#[derive(Debug, Clone, Serialize)]
pub struct FigureRuns {
    /// Its value in each run, in run order (`null`: not measured in that run).
    pub values: Vec<Option<f64>>,
    /// `None` when no run measured it.
    pub spread: Option<Spread>,
}

/// One row (arm and phase, or mode and load) over the runs.
#[derive(Debug, Clone, Serialize)]
pub struct SpreadRow {
    pub key: [String; 2],
    /// By [`Spec::key`], in the layout's order.
    pub figures: Vec<(&'static str, FigureRuns)>,
}

/// A scenario over several runs.
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    pub scenario: String,
    pub quick: bool,
    /// The runs' files, in order.
    pub runs: Vec<PathBuf>,
    /// Their seeds (`null` where a run did not record it); empty for a scenario that
    /// draws nothing at random.
    pub seeds: Vec<Option<u64>>,
    pub rows: Vec<SpreadRow>,
    /// Case C's failover phase over the runs (`--failover`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub failover: Option<FailoverRuns>,
    #[serde(skip)]
    pub layout: Layout,
}

/// The failover phase over the runs: the takeover's spread, and each run's own.
#[derive(Debug, Clone, Serialize)]
pub struct FailoverRuns {
    /// From the kill to the standby's leadership, ms (`null`: no takeover in that run).
    pub takeover_ms: FigureRuns,
    /// Each run's failover, in run order.
    pub runs: Vec<Failover>,
}

impl FailoverRuns {
    /// Every run had the phase, or none did (`None`).
    fn of(runs: &[Run]) -> Option<FailoverRuns> {
        let each: Vec<Failover> = runs
            .iter()
            .map(|r| r.failover.clone())
            .collect::<Option<_>>()?;
        let values: Vec<Option<f64>> = each
            .iter()
            .map(|f| f.takeover_ms.map(|ms| ms as f64))
            .collect();
        Some(FailoverRuns {
            takeover_ms: FigureRuns {
                spread: Spread::of(&values),
                values,
            },
            runs: each,
        })
    }

    fn markdown(&self, s: &mut String, scenario: &str) {
        let runs = self.runs.len();
        let _ = writeln!(
            s,
            "\n#### {scenario}: failover of the global controller, {runs} runs\n\nC_p1 killed (SIGKILL) a quarter into the failover phase's second pass; the standby C_p2 active after {} ms (median and range over the runs that saw it take over). Requests due from the kill to the takeover, ok of due, in that pass and in the same window of the phase's control pass (the same schedule, nothing killed):\n\n| run | takeover ms | spilling at the kill | seen not spilling after | no active global: failover ok/due | control ok/due |\n|---|---|---|---|---|---|",
            self.takeover_ms
                .spread
                .map_or_else(|| MISSING.to_owned(), |sp| sp.cell(0, runs)),
        );
        for (i, f) in self.runs.iter().enumerate() {
            let gap = |pass: &str| {
                f.windows
                    .iter()
                    .find(|w| w.pass == pass && w.window == failover::GAP)
                    .map_or_else(|| MISSING.to_owned(), |w| format!("{}/{}", w.ok, w.due))
            };
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} | {} | {} |",
                i + 1,
                f.takeover_ms
                    .map_or_else(|| "none in 15 s".to_owned(), |ms| ms.to_string()),
                failover::domains(&f.spilling_at_kill),
                failover::domains(&f.spill_dropped),
                gap("failover"),
                gap("control"),
            );
        }
    }
}

/// Spreads `runs` figure by figure. They must be runs of the same scenario and variant,
/// with the same rows (the first run's order is kept).
pub fn summarize(runs: &[Run]) -> Result<Summary> {
    let Some(first) = runs.first() else {
        bail!("no runs to summarise");
    };
    let keys: Vec<&[String; 2]> = first.samples.iter().map(|s| &s.key).collect();
    let layout = Layout::of(&first.scenario);
    let [k1, k2] = layout.keys;
    let mut problems = Vec::new();
    for r in &runs[1..] {
        if (r.scenario.as_str(), r.quick) != (first.scenario.as_str(), first.quick) {
            problems.push(format!(
                "{}: {}{} where {} is {}{}",
                r.path.display(),
                r.scenario,
                if r.quick { " --quick" } else { "" },
                first.path.display(),
                first.scenario,
                if first.quick { " --quick" } else { "" },
            ));
            continue;
        }
        if r.failover.is_some() != first.failover.is_some() {
            problems.push(format!(
                "{}: {} the failover phase (`--failover`) where {} {}",
                r.path.display(),
                if r.failover.is_some() {
                    "with"
                } else {
                    "without"
                },
                first.path.display(),
                if first.failover.is_some() {
                    "has it"
                } else {
                    "has none"
                },
            ));
        }
        let theirs: Vec<&[String; 2]> = r.samples.iter().map(|s| &s.key).collect();
        for k in &keys {
            if !theirs.contains(k) {
                problems.push(format!(
                    "{}: no row {k1} {} {k2} {}",
                    r.path.display(),
                    k[0],
                    k[1]
                ));
            }
        }
        for k in &theirs {
            if !keys.contains(k) {
                problems.push(format!(
                    "{}: row {k1} {} {k2} {} is not in {}",
                    r.path.display(),
                    k[0],
                    k[1],
                    first.path.display()
                ));
            }
        }
    }
    if !problems.is_empty() {
        bail!(
            "the runs are not of one scenario:\n  {}",
            problems.join("\n  ")
        );
    }
    let rows = keys
        .iter()
        .map(|&key| {
            let of_run: Vec<&Sample> = runs
                .iter()
                .filter_map(|r| r.samples.iter().find(|s| &s.key == key))
                .collect();
            let figures = layout
                .figures
                .iter()
                .enumerate()
                .map(|(i, spec)| {
                    let values: Vec<Option<f64>> = of_run
                        .iter()
                        .map(|s| s.values.get(i).copied().flatten())
                        .collect();
                    let spread = Spread::of(&values);
                    (spec.key, FigureRuns { values, spread })
                })
                .collect();
            SpreadRow {
                key: key.clone(),
                figures,
            }
        })
        .collect();
    Ok(Summary {
        scenario: first.scenario.clone(),
        quick: first.quick,
        runs: runs.iter().map(|r| r.path.clone()).collect(),
        seeds: if layout.seeded {
            runs.iter().map(|r| r.seed).collect()
        } else {
            Vec::new()
        },
        rows,
        failover: FailoverRuns::of(runs),
        layout,
    })
}

impl Summary {
    /// The run's tables, each cell the median and range over the runs, and the arms'
    /// order where the layout has one.
    pub fn markdown(&self) -> String {
        let runs = self.runs.len();
        let [k1, k2] = self.layout.keys;
        let mut s = String::new();
        let _ = writeln!(
            s,
            "### {}{}: {runs} runs\n",
            self.scenario,
            if self.quick { " (quick)" } else { "" }
        );
        let _ = writeln!(s, "Runs (in order):\n");
        for (i, path) in self.runs.iter().enumerate() {
            match self.seeds.get(i) {
                Some(seed) => {
                    let seed = seed.map_or_else(|| "not recorded".to_owned(), |s| s.to_string());
                    let _ = writeln!(s, "- `{}` (seed {seed})", path.display());
                }
                None => {
                    let _ = writeln!(s, "- `{}`", path.display());
                }
            }
        }
        if !self.layout.seeded {
            let _ = writeln!(
                s,
                "\nThe {} scenario draws nothing at random: its runs differ only by the machine.",
                self.scenario
            );
        }
        let _ = writeln!(
            s,
            "\nEach cell: the median over the runs, and (smallest–largest) where they differ; `[n=k]` where only k runs measured the figure (an iperf3 or ping that gave no result), {MISSING} where none did. Every run's value is in the CSV and JSON."
        );
        if let Some(row) = self.rows.first()
            && let (Some(cap), Some(p99)) =
                (row.spread("capacity_rps"), row.spread("unloaded_p99_ms"))
        {
            let _ = writeln!(
                s,
                "\nCalibration (each run measures its own): capacity {} req/s, unloaded p99 {} ms.",
                cap.cell(1, runs),
                p99.cell(1, runs)
            );
        }
        for (t, title) in self.layout.tables.iter().enumerate() {
            let specs: Vec<&Spec> = self
                .layout
                .figures
                .iter()
                .filter(|f| f.table == Some(t))
                .collect();
            let _ = writeln!(s, "\n#### {}: {title}, {runs} runs\n", self.scenario);
            let _ = writeln!(
                s,
                "| {k1} | {k2} | {} |",
                specs
                    .iter()
                    .map(|f| f.header)
                    .collect::<Vec<_>>()
                    .join(" | ")
            );
            let _ = writeln!(s, "|---|---|{}", "---|".repeat(specs.len()));
            for row in &self.rows {
                let cells: Vec<String> = specs
                    .iter()
                    .map(|f| {
                        row.spread(f.key)
                            .map_or_else(|| MISSING.to_owned(), |sp| sp.cell(f.digits, runs))
                    })
                    .collect();
                let _ = writeln!(
                    s,
                    "| {} | {} | {} |",
                    row.key[0],
                    row.key[1],
                    cells.join(" | ")
                );
            }
        }
        if let Some(f) = &self.failover {
            f.markdown(&mut s, &self.scenario);
        }
        if let Some((at, lines)) = self.order() {
            let _ = writeln!(
                s,
                "\n#### {}: the order at {k2} {at}, {runs} runs\n\nBest first by the median; between two neighbours `<` where their ranges do not overlap (every run put them in that order), `≈` where they do (these runs do not order them). Chance alone gives two arms that do not differ ranges that do not overlap once in {} (each arm's {runs} runs exchangeable): read a `<` as firm only with more runs than that makes rare.\n",
                self.scenario,
                apart_by_chance(runs)
            );
            for line in lines {
                let _ = writeln!(s, "- {line}");
            }
        }
        s
    }

    /// Where the layout orders the rows (their second key) and one line per figure it
    /// orders by: the rows there, best first by their median, each pair of neighbours
    /// joined by `<`, or by `≈` where their ranges overlap. `None` with fewer than two.
    fn order(&self) -> Option<(String, Vec<String>)> {
        let order = self.layout.order?;
        let at = match order.at {
            Some(at) => at.to_owned(),
            None => self
                .rows
                .iter()
                .filter_map(|r| Some((r.key[1].parse::<f64>().ok()?, &r.key[1])))
                .max_by(|a, b| a.0.total_cmp(&b.0))
                .map(|(_, k)| k.clone())?,
        };
        let there: Vec<&SpreadRow> = self.rows.iter().filter(|r| r.key[1] == at).collect();
        if there.len() < 2 {
            return None;
        }
        let mut lines = Vec::new();
        for &(key, lower_better) in order.by {
            let Some(spec) = self.layout.spec(key) else {
                continue;
            };
            let mut ranked: Vec<(&str, Spread)> = there
                .iter()
                .filter_map(|r| Some((r.key[0].as_str(), r.spread(key)?)))
                .collect();
            if ranked.len() < 2 {
                continue;
            }
            ranked.sort_by(|a, b| {
                let o = a.1.median.total_cmp(&b.1.median);
                if lower_better { o } else { o.reverse() }
            });
            let d = spec.digits;
            let mut line = format!("{}: ", spec.header);
            for (i, (name, sp)) in ranked.iter().enumerate() {
                if i > 0 {
                    let prev = ranked[i - 1].1;
                    // At the shown decimals: two values that print alike are not apart.
                    let shown = |v: f64| format!("{v:.d$}").parse::<f64>().unwrap_or(v);
                    let apart = shown(prev.max) < shown(sp.min) || shown(sp.max) < shown(prev.min);
                    line += if apart { " < " } else { " ≈ " };
                }
                let _ = write!(line, "{name} {:.d$}", sp.median);
            }
            lines.push(line);
        }
        Some((at, lines))
    }

    /// One line per row and figure: `n`, median, min, max and every run's value
    /// (`;`-separated, empty where missing).
    pub fn csv(&self) -> String {
        let [k1, k2] = self.layout.keys;
        let mut s = format!("scenario,quick,{k1},{k2},figure,n,median,min,max,values\n");
        for row in &self.rows {
            for (key, fr) in &row.figures {
                let values: Vec<String> = fr
                    .values
                    .iter()
                    .map(|v| v.map_or_else(String::new, |v| v.to_string()))
                    .collect();
                let (n, median, min, max) = fr.spread.map_or_else(
                    || ("0".to_owned(), String::new(), String::new(), String::new()),
                    |sp| {
                        (
                            sp.n.to_string(),
                            sp.median.to_string(),
                            sp.min.to_string(),
                            sp.max.to_string(),
                        )
                    },
                );
                let _ = writeln!(
                    s,
                    "{},{},{},{},{key},{n},{median},{min},{max},{}",
                    self.scenario,
                    self.quick,
                    row.key[0],
                    row.key[1],
                    values.join(";")
                );
            }
        }
        s
    }

    /// Writes `NAME-runs.md`, `.csv` and `.json` into `out`; returns their paths.
    pub fn write(&self, out: &Path) -> Result<Vec<PathBuf>> {
        std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
        let stem = format!("{}-runs", self.scenario);
        let mut files = Vec::new();
        for (ext, text) in [
            ("md", self.markdown()),
            ("csv", self.csv()),
            ("json", serde_json::to_string_pretty(self)?),
        ] {
            let p = out.join(format!("{stem}.{ext}"));
            std::fs::write(&p, text).with_context(|| format!("writing {}", p.display()))?;
            files.push(p);
        }
        Ok(files)
    }
}

/// One in how many: the chance that two arms whose `runs` values each come from one
/// distribution have ranges that do not overlap, either way round. Of the C(2n, n) equally
/// likely ways to deal the 2n ordered values between them, two put all of one arm's below
/// all of the other's. 1 in 3 for two runs, 10 for three, 35 for four, 126 for five.
fn apart_by_chance(runs: usize) -> u128 {
    let n = runs as u128;
    // C(2n, n) built up as C(n + k, k) for k = 1..=n: every step divides exactly, and
    // u128 holds every step up to the 50 runs `--runs` takes (C(100, 50) ≈ 1.0e29).
    let ways = (1..=n).fold(1u128, |c, k| c.saturating_mul(n + k) / k);
    ways / 2
}

impl SpreadRow {
    /// The figure named `key`.
    pub fn figure(&self, key: &str) -> Option<&FigureRuns> {
        self.figures.iter().find(|(k, _)| *k == key).map(|(_, f)| f)
    }

    /// The spread of the figure named `key`, if any run measured it.
    pub fn spread(&self, key: &str) -> Option<Spread> {
        self.figure(key).and_then(|f| f.spread)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sp(n: usize, median: f64, min: f64, max: f64) -> Spread {
        Spread {
            n,
            median,
            min,
            max,
        }
    }

    /// The failover phase over three runs: the takeover's spread over the runs that saw
    /// one, and each run's own line; runs with and without the phase are refused.
    #[test]
    fn failover_runs_show_the_takeover_and_each_runs_gap() {
        let window = |pass: &str, ok: u64, due: u64| failover::Window {
            pass: pass.to_owned(),
            window: failover::GAP.to_owned(),
            from_s: 1.0,
            to_s: 3.0,
            due,
            ok,
            failed: due - ok,
            spilled_ok: 0,
            p99_ms: None,
        };
        let with = |path: &str, ms: Option<u64>, dropped: &[&str]| Run {
            failover: Some(Failover {
                killed_at_s: 1.0,
                takeover_ms: ms,
                spilling_at_kill: vec!["d1".to_owned(), "d3".to_owned()],
                spill_dropped: dropped.iter().map(|d| (*d).to_owned()).collect(),
                samples_in_gap: 12,
                windows: vec![window("control", 900, 1000), window("failover", 850, 1000)],
            }),
            ..case_d(path, 1, |_| {})
        };
        let runs = [
            with("a", Some(2100), &[]),
            with("b", Some(1800), &["d3"]),
            with("c", None, &[]),
        ];
        let s = summarize(&runs).expect("one scenario");
        let f = s.failover.as_ref().expect("the failover phase");
        assert_eq!(f.takeover_ms.values, [Some(2100.0), Some(1800.0), None]);
        assert_eq!(f.takeover_ms.spread, Some(sp(2, 1950.0, 1800.0, 2100.0)));
        let md = s.markdown();
        assert!(
            md.contains("C_p2 active after 1950 (1800–2100) [n=2] ms"),
            "{md}"
        );
        assert!(
            md.contains("| 2 | 1800 | d1, d3 | d3 | 850/1000 | 900/1000 |"),
            "{md}"
        );
        assert!(md.contains("| 3 | none in 15 s | d1, d3 | none |"), "{md}");
        // The JSON carries it; a summary of runs without it has no such section.
        let json = serde_json::to_value(&s).expect("json");
        assert_eq!(json["failover"]["runs"].as_array().map(Vec::len), Some(3));
        let plain = summarize(&[case_d("a", 1, |_| {}), case_d("b", 2, |_| {})]).expect("plain");
        assert!(plain.failover.is_none());
        assert!(!plain.markdown().contains("failover"));
        // One run with the phase and one without: refused, named.
        let e =
            summarize(&[with("a", Some(2000), &[]), case_d("b", 2, |_| {})]).expect_err("mixed");
        assert!(
            e.to_string()
                .contains("b: without the failover phase (`--failover`) where a has it"),
            "{e}"
        );
    }

    #[test]
    fn spread_is_median_and_range_of_what_was_measured() {
        let s = Spread::of(&[Some(3.0), None, Some(1.0), Some(2.0)]).expect("three values");
        assert_eq!(s, sp(3, 2.0, 1.0, 3.0));
        let even = Spread::of(&[Some(4.0), Some(1.0), Some(2.0), Some(10.0)]).expect("four");
        assert_eq!(even, sp(4, 3.0, 1.0, 10.0));
        assert_eq!(Spread::of(&[None, None]), None);
        assert_eq!(Spread::of(&[Some(f64::NAN)]), None, "not a measurement");
        assert_eq!(Spread::of(&[Some(5.0)]).map(|s| s.median), Some(5.0));
    }

    #[test]
    fn cell_shows_the_range_only_where_runs_differ_and_counts_the_missing() {
        let same = sp(3, 2.0, 2.0, 2.0);
        assert_eq!(same.cell(1, 3), "2.0");
        let close = sp(3, 0.9996, 0.9995, 1.0);
        assert_eq!(close.cell(3, 3), "1.000", "the same to three decimals");
        let spread = sp(2, 1.5, 1.0, 2.0);
        assert_eq!(spread.cell(2, 3), "1.50 (1.00–2.00) [n=2]");
    }

    /// A real quick Case D run as the lab wrote it (docs/results), so the summary reads
    /// what the lab writes; `edit` changes its rows first.
    fn case_d(path: &str, seed: u64, edit: impl Fn(&mut Row)) -> Run {
        let mut f: RunFile =
            serde_json::from_str(include_str!("../../../docs/results/quick/case-d.json"))
                .expect("the lab's JSON");
        f.seed = Some(seed);
        f.rows.iter_mut().for_each(edit);
        Run::from_file(f, PathBuf::from(path)).expect("rows")
    }

    fn scaled(path: &str, seed: u64, by: f64) -> Run {
        case_d(path, seed, |r| {
            r.ok = (r.ok as f64 * by).round() as u64;
            r.isl_pct = r.isl_pct.map(|v| v * by);
        })
    }

    fn row<'a>(s: &'a Summary, arm: &str, phase: &str) -> &'a SpreadRow {
        s.rows
            .iter()
            .find(|r| r.key == [arm, phase])
            .unwrap_or_else(|| panic!("no {arm} {phase}"))
    }

    #[test]
    fn summary_of_three_runs_spreads_each_figure_of_each_row() {
        let base = case_d("a", 1, |_| {});
        let runs = [
            scaled("a", 1, 1.0),
            scaled("b", 2, 0.5),
            scaled("c", 3, 0.9),
        ];
        let s = summarize(&runs).expect("one scenario");
        assert_eq!(s.rows.len(), base.samples.len());
        assert_eq!(s.seeds, [Some(1), Some(2), Some(3)]);
        let at = |key: &str| {
            let i = s
                .layout
                .figures
                .iter()
                .position(|f| f.key == key)
                .expect("figure");
            base.samples[1].values[i].expect("measured in the heavy row")
        };
        let (ok, isl) = (at("ok"), at("isl_pct"));
        assert_eq!(base.samples[1].key, ["isslm", "heavy"]);
        let heavy = row(&s, "isslm", "heavy");
        let (half, most) = ((ok * 0.5).round(), (ok * 0.9).round());
        assert_eq!(heavy.spread("ok"), Some(sp(3, most, half, ok)));
        let i = heavy.spread("isl_pct").expect("heavy %I_SL");
        assert!((i.median - isl * 0.9).abs() < 1e-9 && (i.min - isl * 0.5).abs() < 1e-9);
        // The normal phase has no %I_SL: missing in every run, and shown so.
        let normal = row(&s, "isslm", "normal");
        assert!(normal.figure("isl_pct").is_some_and(|f| f.spread.is_none()));
        let md = s.markdown();
        assert!(md.contains("| arm | phase | B_d(max) Gb/s |"), "{md}");
        assert!(
            md.contains(&format!("{most:.0} ({half:.0}–{ok:.0})")),
            "{md}"
        );
        let csv = s.csv();
        assert!(csv.starts_with("scenario,quick,arm,phase,figure,"));
        assert_eq!(csv.lines().count(), 1 + s.rows.len() * CASE_FIGURES.len());
        let line = format!("case-d,true,isslm,heavy,ok,3,{most},{half},{ok},{ok};{half};{most}");
        assert!(csv.lines().any(|l| l == line), "{line} in\n{csv}");
    }

    fn order_line(s: &Summary, figure: &str) -> String {
        let (_, lines) = s.order().expect("an order");
        lines
            .into_iter()
            .find(|l| l.starts_with(figure))
            .unwrap_or_else(|| panic!("no {figure} line"))
    }

    #[test]
    fn arms_are_ordered_and_neighbours_whose_ranges_overlap_are_not() {
        // Heavy %I_SL 10·(k+1) + run for the k-th arm: isslm 10–11, dwrs 20–21, ...: no
        // neighbours overlap. Then dwrs's second run falls onto isslm's range.
        let arms = ["isslm", "dwrs", "mrbs", "amlob", "srt", "round-robin"];
        let isl = |run: f64, dwrs: Option<f64>| {
            move |r: &mut Row| {
                let k = arms.iter().position(|a| *a == r.arm).expect("arm") as f64;
                if r.phase == "heavy" {
                    r.isl_pct = Some(10.0 * (k + 1.0) + run);
                    if r.arm == "dwrs" && dwrs.is_some() {
                        r.isl_pct = dwrs;
                    }
                }
            }
        };
        let s = summarize(&[
            case_d("a", 1, isl(0.0, None)),
            case_d("b", 2, isl(1.0, None)),
        ])
        .expect("one scenario");
        let line = order_line(&s, "%I_SL");
        assert!(
            line.starts_with("%I_SL: isslm 10.50 < dwrs 20.50 < mrbs 30.50"),
            "{line}"
        );
        let s = summarize(&[
            case_d("a", 1, isl(0.0, None)),
            case_d("b", 2, isl(1.0, Some(10.8))),
        ])
        .expect("one scenario");
        let line = order_line(&s, "%I_SL");
        assert!(
            line.starts_with("%I_SL: isslm 10.50 ≈ dwrs 15.40 < mrbs 30.50"),
            "{line}"
        );
        assert!(s.markdown().contains(&format!("- {line}")));
        // Jain 1 in both runs against 0.99996 in both: apart, but not at the three
        // decimals shown, so not ordered.
        let jain = |r: &mut Row| r.jain = if r.arm == "round-robin" { 1.0 } else { 0.99996 };
        let s = summarize(&[case_d("a", 1, jain), case_d("b", 2, jain)]).expect("one");
        let line = order_line(&s, "Jain");
        assert!(!line.contains('<'), "{line}");
    }

    #[test]
    fn a_run_is_read_back_exactly_as_it_was_written() {
        // A B_d(max) from a lab run that the default float parser read one ulp off.
        let mut f: RunFile =
            serde_json::from_str(include_str!("../../../docs/results/quick/case-d.json"))
                .expect("JSON");
        f.rows[0].bdmax_gbps = Some(0.172_399_858_945_736_15);
        let text = serde_json::to_string(&f.rows).expect("rows");
        let back: Vec<Row> = serde_json::from_str(&text).expect("rows back");
        assert_eq!(back[0].bdmax_gbps, Some(0.172_399_858_945_736_15));
        assert_eq!(back, f.rows, "every figure of every row");
    }

    #[test]
    fn chance_of_ranges_apart_is_two_of_the_ways_to_deal_the_runs() {
        let got: Vec<u128> = (2..=6).map(apart_by_chance).collect();
        assert_eq!(got, [3, 10, 35, 126, 462]);
        // C(100, 50) / 2, exactly.
        assert_eq!(
            apart_by_chance(crate::MAX_RUNS as usize),
            50_445_672_272_782_096_667_406_248_628
        );
        let s = summarize(&[case_d("a", 1, |_| {}), case_d("b", 2, |_| {})]).expect("one");
        assert!(
            s.markdown()
                .contains("once in 3 (each arm's 2 runs exchangeable)")
        );
    }

    #[test]
    fn runs_of_other_scenarios_or_rows_are_refused_with_every_reason() {
        let mut other: RunFile =
            serde_json::from_str(include_str!("../../../docs/results/quick/case-d.json"))
                .expect("JSON");
        other.quick = false;
        let other = Run::from_file(other, PathBuf::from("b")).expect("rows");
        let mut fewer = case_d("c", 3, |_| {});
        fewer.samples.pop();
        let err = summarize(&[case_d("a", 1, |_| {}), other, fewer]).expect_err("mismatch");
        let msg = format!("{err:#}");
        assert!(msg.contains("b: case-d where a is case-d --quick"), "{msg}");
        assert!(
            msg.contains("c: no row arm round-robin phase heavy"),
            "{msg}"
        );
        assert!(summarize(&[]).is_err());
        assert!(
            Run::parse(
                "{\"scenario\": \"case-a\", \"quick\": true, \"rows\": []}",
                PathBuf::new()
            )
            .is_err()
        );
    }

    #[test]
    fn the_overload_scenario_is_summarised_by_mode_and_load_and_ordered_at_the_top_load() {
        let text = include_str!("../../../docs/results/overload/overload.json");
        let a = Run::parse(text, PathBuf::from("a")).expect("the lab's overload JSON");
        let b = Run::parse(text, PathBuf::from("b")).expect("again");
        assert_eq!(a.samples.len(), 20, "four modes at five loads");
        let s = summarize(&[a, b]).expect("one scenario");
        let r = row(&s, "adaptive", "3");
        let goodput = r.spread("goodput_rps").expect("goodput");
        let cap = r.spread("capacity_rps").expect("capacity");
        let per = r.spread("goodput_per_capacity").expect("ratio");
        assert!((per.median - goodput.median / cap.median).abs() < 1e-12);
        let md = s.markdown();
        assert!(md.contains("| mode | × capacity | offered req/s |"), "{md}");
        assert!(
            s.seeds.is_empty() && md.contains("- `a`\n") && !md.contains("seed"),
            "{md}"
        );
        assert!(md.contains("draws nothing at random"), "{md}");
        assert!(
            md.contains("Calibration (each run measures its own): capacity "),
            "{md}"
        );
        let (at, lines) = s.order().expect("ordered");
        assert_eq!(at, "3");
        assert_eq!(lines.len(), 3, "goodput, p99, timeouts: {lines:?}");
        assert!(lines[0].starts_with("goodput req/s: "), "{lines:?}");
        assert!(
            s.csv()
                .starts_with("scenario,quick,mode,× capacity,figure,")
        );
    }
}
