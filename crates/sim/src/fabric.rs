//! The simulated network: a leaf-spine fabric (every leaf linked to every spine), servers
//! and clients at the leaves, and their addresses.
//!
//! Ports of a leaf: `1..=spines` its uplinks (uplink `s` to spine `s`), then its servers,
//! then its clients. Ports of a spine: `1..=leaves`, port `l` to leaf `l`. Leaves are
//! datapaths `1..=leaves`, spines `SPINE_BASE + 1..`.

use std::net::Ipv4Addr;

use flowgate_packet::MacAddr;

/// The first spine's datapath id less one.
pub const SPINE_BASE: u64 = 0x1000;

/// The shape of the fabric.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Shape {
    pub leaves: u32,
    pub spines: u32,
    pub servers_per_leaf: u32,
    pub clients_per_leaf: u32,
}

/// Where a host is: its leaf and port.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Attach {
    pub dpid: u64,
    pub port: u32,
}

/// A host of the fabric: its addresses and where it is attached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Host {
    pub ip: Ipv4Addr,
    pub mac: MacAddr,
    pub at: Attach,
}

impl Shape {
    pub fn servers(&self) -> usize {
        (self.leaves * self.servers_per_leaf) as usize
    }

    pub fn clients(&self) -> usize {
        (self.leaves * self.clients_per_leaf) as usize
    }

    /// Every switch: its datapath id and its number of ports.
    pub fn switches(&self) -> Vec<(u64, u32)> {
        let leaf_ports = self.spines + self.servers_per_leaf + self.clients_per_leaf;
        let leaves = (1..=u64::from(self.leaves)).map(|d| (d, leaf_ports));
        let spines = (1..=u64::from(self.spines)).map(|s| (SPINE_BASE + s, self.leaves));
        leaves.chain(spines).collect()
    }

    /// The other end of a link port, if `at` is one.
    pub fn peer(&self, at: Attach) -> Option<Attach> {
        if at.dpid > SPINE_BASE {
            let spine = (at.dpid - SPINE_BASE) as u32;
            (at.port >= 1 && at.port <= self.leaves).then_some(Attach {
                dpid: u64::from(at.port),
                port: spine,
            })
        } else {
            (at.port >= 1 && at.port <= self.spines).then_some(Attach {
                dpid: SPINE_BASE + u64::from(at.port),
                port: at.dpid as u32,
            })
        }
    }

    /// Links, each once.
    pub fn links(&self) -> usize {
        (self.leaves * self.spines) as usize
    }

    /// Server `i` (0-based, leaf by leaf): `10.1.<leaf>.<n>`, so at most 250 a leaf, on
    /// the leaf's ports after its uplinks.
    pub fn server(&self, i: usize) -> Host {
        self.host(1, i, self.servers_per_leaf, self.spines)
    }

    /// Client `i` (0-based, leaf by leaf): `10.2.<leaf>.<n>`, on the ports after the
    /// servers'.
    pub fn client(&self, i: usize) -> Host {
        self.host(
            2,
            i,
            self.clients_per_leaf,
            self.spines + self.servers_per_leaf,
        )
    }

    /// Host `i` of a kind (`10.<kind>.<leaf>.<n>`), `per` a leaf, from port `after + 1`.
    fn host(&self, kind: u8, i: usize, per: u32, after: u32) -> Host {
        let per = per.max(1) as usize;
        let (leaf, n) = (i / per, i % per);
        Host {
            ip: Ipv4Addr::new(10, kind, leaf as u8 + 1, n as u8 + 1),
            mac: MacAddr([0x02, 0x5e, kind, 0x00, leaf as u8 + 1, n as u8 + 1]),
            at: Attach {
                dpid: leaf as u64 + 1,
                port: after + n as u32 + 1,
            },
        }
    }

    /// What is wrong with the shape, if anything (addresses allow 250 leaves and 250
    /// hosts of each kind a leaf).
    pub fn check(&self) -> Result<(), String> {
        let fits = |n: u32, what: &str| {
            if (1..=250).contains(&n) {
                Ok(())
            } else {
                Err(format!("{what} must be in 1..=250, not {n}"))
            }
        };
        fits(self.leaves, "leaves")?;
        fits(self.spines, "spines")?;
        fits(self.servers_per_leaf, "servers per leaf")?;
        fits(self.clients_per_leaf, "clients per leaf")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_link_port_has_a_peer_that_points_back() {
        let s = Shape {
            leaves: 4,
            spines: 2,
            servers_per_leaf: 3,
            clients_per_leaf: 2,
        };
        let mut links = 0;
        for (dpid, ports) in s.switches() {
            for port in 1..=ports {
                let at = Attach { dpid, port };
                if let Some(peer) = s.peer(at) {
                    links += 1;
                    assert_eq!(s.peer(peer), Some(at));
                }
            }
        }
        assert_eq!(links, 2 * s.links());
        // Hosts sit on ports that are not links, each on its own.
        let mut seen = std::collections::HashSet::new();
        for i in 0..s.servers() {
            let h = s.server(i);
            assert_eq!(s.peer(h.at), None);
            assert!(seen.insert((h.at.dpid, h.at.port)));
        }
        for i in 0..s.clients() {
            let h = s.client(i);
            assert_eq!(s.peer(h.at), None);
            assert!(seen.insert((h.at.dpid, h.at.port)));
        }
    }
}
