//! `--idle-poll`: keep every CPU from going idle while the bench measures, as the kernel's
//! `idle=poll` boot option does.
//!
//! An idle CPU halts, and waking a halted CPU for a message that has just arrived costs
//! its exit latency: a microsecond or two on bare metal, but tens to hundreds in a virtual
//! machine (the host must schedule the virtual CPU again), more under nested
//! virtualisation. At the moderate rates where a setup-latency figure is read, both the
//! controller and the emulated switches sleep between messages, so the figure measures
//! those wake-ups as much as the controller. Latency-critical deployments boot with
//! `idle=poll` or a polling cpuidle governor; this VM's kernel command line cannot be
//! changed, so the bench does the same from user space: one busy process per CPU, at
//! `SCHED_IDLE` (chrt(1)), which runs only when nothing else wants the CPU and yields to
//! any woken task at once. It applies to the CPUs, so to every peer measured alike; its
//! CPU time is not counted as the controller's or the bench's.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

/// The busy processes, one per CPU; killed when dropped.
pub struct IdlePoll {
    children: Vec<Child>,
}

impl IdlePoll {
    /// Start one busy process on each CPU this process may use.
    pub fn start() -> anyhow::Result<IdlePoll> {
        let exe = std::env::current_exe().context("the bench's own binary")?;
        let set = rustix::thread::sched_getaffinity(None).context("sched_getaffinity")?;
        let cpus: Vec<usize> = (0..rustix::thread::CpuSet::MAX_CPU)
            .filter(|&c| set.is_set(c))
            .collect();
        let mut me = IdlePoll {
            children: Vec::new(),
        };
        for &cpu in &cpus {
            let child = Command::new("chrt")
                .args(["--idle", "0"])
                .arg(&exe)
                .args(["bench", "controller", "--idle-spin"])
                .arg(cpu.to_string())
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .spawn()
                .context("--idle-poll: cannot run chrt (util-linux)")?;
            me.children.push(child);
        }
        // Each child sets its own CPU; give them a moment, then check they are running.
        let deadline = Instant::now() + Duration::from_secs(2);
        while Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
            if me
                .children
                .iter()
                .zip(&cpus)
                .all(|(c, &cpu)| spinning(c.id(), cpu))
            {
                return Ok(me);
            }
            for c in &mut me.children {
                if let Ok(Some(status)) = c.try_wait() {
                    bail!("--idle-poll: a busy process exited ({status})");
                }
            }
        }
        bail!("--idle-poll: the busy processes did not reach SCHED_IDLE on their CPUs")
    }
}

/// Whether `pid` runs at `SCHED_IDLE` (policy 5 in field 41 of /proc/PID/stat, proc(5))
/// on `cpu` alone.
fn spinning(pid: u32, cpu: usize) -> bool {
    let on_cpu = rustix::thread::Pid::from_raw(pid as i32)
        .and_then(|p| rustix::thread::sched_getaffinity(Some(p)).ok())
        .is_some_and(|set| {
            (0..rustix::thread::CpuSet::MAX_CPU).all(|c| set.is_set(c) == (c == cpu))
        });
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    // Fields after the command name (which may hold spaces), from field 3 on.
    let Some(rest) = stat.rfind(')').and_then(|i| stat.get(i + 2..)) else {
        return false;
    };
    on_cpu && rest.split_whitespace().nth(41 - 3) == Some("5")
}

impl Drop for IdlePoll {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// The busy process (`bench controller --idle-spin CPU`): run on `cpu` until the parent
/// is gone. No PAUSE instruction in the loop: a hypervisor's pause-loop exiting takes a
/// spinning virtual CPU off its physical one, which is what this is here to prevent.
pub fn spin(cpu: usize) -> anyhow::Result<()> {
    let mut set = rustix::thread::CpuSet::new();
    set.set(cpu);
    rustix::thread::sched_setaffinity(None, &set).context("sched_setaffinity")?;
    let parent = std::os::unix::process::parent_id();
    let mut n = 0u64;
    loop {
        for _ in 0..1u32 << 22 {
            n = std::hint::black_box(n.wrapping_add(1));
        }
        // Reparented: the bench is gone (killed without running its drops).
        if std::os::unix::process::parent_id() != parent {
            return Ok(());
        }
    }
}
