//! Root-namespace network interfaces: name checks, existence, removal. Shared by the
//! namespaces (veth pairs) and the bridges (their ports).

use std::path::Path;
use std::time::{Duration, Instant};

use crate::cmd;
use crate::error::{Error, Result};

/// Maximum length of a Linux interface name (IFNAMSIZ - 1).
pub const MAX_IFNAME: usize = 15;

/// Checks that `name` is usable as an interface / bridge name.
pub fn check_ifname(name: &str) -> Result<()> {
    if name.is_empty() || name.len() > MAX_IFNAME {
        return Err(Error::Invalid(format!(
            "interface name `{name}` must be 1..={MAX_IFNAME} characters"
        )));
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    {
        return Err(Error::Invalid(format!(
            "interface name `{name}` has characters other than [A-Za-z0-9_-]"
        )));
    }
    Ok(())
}

/// True if an interface of that name exists in the root namespace.
pub fn link_exists(iface: &str) -> bool {
    Path::new("/sys/class/net").join(iface).exists()
}

/// Waits up to `timeout` for a root-namespace interface to disappear; true if it did.
pub fn wait_link_gone(iface: &str, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    while link_exists(iface) {
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    true
}

/// `ip link del IFACE`; succeeds if the interface is gone afterwards, whoever removed it
/// (a namespace being deleted takes its veth peers with it, asynchronously).
pub fn del_link(iface: &str) -> Result<()> {
    match cmd::run("ip", &["link", "del", iface]) {
        Ok(_) => Ok(()),
        Err(_) if wait_link_gone(iface, Duration::from_secs(1)) => Ok(()),
        Err(e) => Err(e),
    }
}

/// Best effort: no IPv6 on a root-namespace interface (keeps router solicitations and DAD
/// out of the controller's PACKET_INs).
pub(crate) fn disable_ipv6(iface: &str) {
    let key = format!("net.ipv6.conf.{iface}.disable_ipv6=1");
    cmd::run_quiet("sysctl", &["-qw", &key]);
}
