//! Running external commands with checked exit status.

use std::process::{Command, Output, Stdio};

use crate::error::{Error, Result};

/// Renders a command line for error messages.
pub fn display(prog: &str, args: &[&str]) -> String {
    let mut s = String::from(prog);
    for a in args {
        s.push(' ');
        if a.is_empty() || a.contains(char::is_whitespace) {
            s.push('\'');
            s.push_str(a);
            s.push('\'');
        } else {
            s.push_str(a);
        }
    }
    s
}

/// Runs `prog args...` and returns its raw output whatever the exit status.
/// Errors only if the program could not be started.
pub fn output(prog: &str, args: &[&str]) -> Result<Output> {
    Command::new(prog)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|source| Error::Spawn {
            cmd: display(prog, args),
            source,
        })
}

/// Runs `prog args...`, fails unless it exits 0, and returns its stdout.
pub fn run(prog: &str, args: &[&str]) -> Result<String> {
    let out = output(prog, args)?;
    check(prog, args, out)
}

/// Turns an [`Output`] into stdout, or an [`Error::Command`] if it failed.
pub fn check(prog: &str, args: &[&str], out: Output) -> Result<String> {
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        let mut stderr = String::from_utf8_lossy(&out.stderr).trim().to_owned();
        if stderr.is_empty() {
            stderr = String::from_utf8_lossy(&out.stdout).trim().to_owned();
        }
        Err(Error::Command {
            cmd: display(prog, args),
            status: out.status.to_string(),
            stderr,
        })
    }
}

/// Runs a command and ignores any failure; for best-effort clean-up in `Drop`.
pub(crate) fn run_quiet(prog: &str, args: &[&str]) {
    if let Err(e) = run(prog, args) {
        tracing::debug!("clean-up step failed (ignored): {e}");
    }
}

/// True if `prog` can be found on `PATH` (or is an existing path).
pub fn have(prog: &str) -> bool {
    if prog.contains('/') {
        return std::path::Path::new(prog).exists();
    }
    std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join(prog).is_file()))
        .unwrap_or(false)
}
