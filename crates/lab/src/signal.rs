//! Ctrl-C / SIGTERM: a flag the lab checks between steps and while it waits, so it
//! returns an error and its drop guards remove every bridge, namespace and process.

use std::sync::Once;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

static INTERRUPTED: AtomicBool = AtomicBool::new(false);
static INSTALL: Once = Once::new();

/// Installs the handler (once per process; later calls do nothing).
pub fn install() {
    INSTALL.call_once(|| {
        if let Err(e) = ctrlc::set_handler(|| INTERRUPTED.store(true, Ordering::SeqCst)) {
            eprintln!("flowgate lab: cannot install the Ctrl-C handler: {e}");
        }
    });
}

/// True once Ctrl-C (SIGINT) or SIGTERM arrived.
pub fn interrupted() -> bool {
    INTERRUPTED.load(Ordering::SeqCst)
}

/// Fails if interrupted.
pub fn check() -> anyhow::Result<()> {
    if interrupted() {
        anyhow::bail!("interrupted (Ctrl-C or SIGTERM); cleaning up");
    }
    Ok(())
}

/// Sleeps up to `d`, waking every 50 ms to check for an interrupt.
pub fn sleep(d: Duration) -> anyhow::Result<()> {
    let end = Instant::now() + d;
    loop {
        check()?;
        let now = Instant::now();
        if now >= end {
            return Ok(());
        }
        std::thread::sleep((end - now).min(Duration::from_millis(50)));
    }
}
