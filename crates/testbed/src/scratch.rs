//! A test's scratch directory: its config files, its controller's log, its reports.

use std::ops::Deref;
use std::path::{Path, PathBuf};

/// `flowgate-<name>-<pid>` under the system's temporary directory, made empty. Dropped, it
/// is removed; but not while the thread panics: a failed test's files (its controller's
/// log, its config) stay for whoever looks into the failure, and their place is printed.
/// Without this a run of the suite left some 150 directories behind, a few of them of
/// debug logs tens of megabytes long.
#[derive(Debug)]
pub struct ScratchDir {
    path: PathBuf,
}

impl ScratchDir {
    /// Make the directory, emptied of what a crashed earlier run of the same process id
    /// may have left in it.
    pub fn new(name: &str) -> std::io::Result<Self> {
        let path = std::env::temp_dir().join(format!("flowgate-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path)?;
        Ok(ScratchDir { path })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Deref for ScratchDir {
    type Target = Path;

    fn deref(&self) -> &Path {
        &self.path
    }
}

impl AsRef<Path> for ScratchDir {
    fn as_ref(&self) -> &Path {
        &self.path
    }
}

impl AsRef<std::ffi::OsStr> for ScratchDir {
    fn as_ref(&self) -> &std::ffi::OsStr {
        self.path.as_os_str()
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("--- kept for inspection: {} ---", self.path.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_scratch_dir_goes_when_dropped_and_stays_when_its_test_fails() {
        let kept = std::thread::spawn(|| {
            let d = ScratchDir::new("scratch-test-kept").expect("scratch dir");
            std::fs::write(d.join("log"), "a failure's log").expect("write");
            let path = d.path().to_path_buf();
            // The test's thread fails with the directory in scope.
            std::panic::panic_any(path);
        })
        .join()
        .expect_err("the thread panicked");
        let kept = kept.downcast::<PathBuf>().expect("the panic's path");
        assert_eq!(
            std::fs::read_to_string(kept.join("log")).ok().as_deref(),
            Some("a failure's log")
        );
        std::fs::remove_dir_all(&*kept).expect("clean up");

        let d = ScratchDir::new("scratch-test-gone").expect("scratch dir");
        std::fs::write(d.join("log"), "x").expect("write");
        let path = d.path().to_path_buf();
        assert!(path.is_dir());
        drop(d);
        assert!(!path.exists(), "{} is still there", path.display());
    }
}
