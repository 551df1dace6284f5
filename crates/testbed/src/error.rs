//! The testbed's error type: every failed command carries its command line and stderr.

use std::io;

/// Result alias for the testbed.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What can go wrong while building or tearing down a test network.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A command ran and exited unsuccessfully.
    #[error("command `{cmd}` failed ({status}): {stderr}")]
    Command {
        /// The command line, as it would be typed.
        cmd: String,
        /// The exit status, e.g. `exit status: 1`.
        status: String,
        /// Its standard error (trimmed), or its stdout if stderr was empty.
        stderr: String,
    },
    /// A command could not be started at all (binary missing, ...).
    #[error("could not run `{cmd}`: {source}")]
    Spawn {
        /// The command line.
        cmd: String,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
    /// An argument was invalid (a name too long for an interface, a bad CIDR, ...).
    #[error("invalid argument: {0}")]
    Invalid(String),
    /// Something did not happen in time.
    #[error("timed out: {0}")]
    Timeout(String),
    /// Output of a command could not be understood.
    #[error("unexpected output from `{cmd}`: {detail}")]
    Parse {
        /// The command line.
        cmd: String,
        /// What was wrong.
        detail: String,
    },
    /// Other I/O error (log files, ...).
    #[error("i/o error: {0}")]
    Io(#[from] io::Error),
}
