//! Test support for the controller core and the crates above it: a fake OpenFlow switch
//! ([`FakeTable`]) and a fake network of them ([`FakeNetwork`]), after Faucet's
//! `fakeoftable`.
//!
//! Tests feed the messages the core emits to the fakes and then ask where packets go,
//! which tests what the rules *do* rather than how they are spelt. A message Open vSwitch
//! would refuse is refused here too ([`FakeTableError::error_kind`] names the OFPT_ERROR),
//! so a bad rule fails the test instead of passing against a too-lenient fake.
//!
//! ```ignore
//! let mut sw = FakeTable::new();
//! sw.apply_all(&msgs_for_switch)?;
//! let syn = flowgate_packet::tcp_syn(client_mac, vip_mac, client, vip, 1);
//! let trace = sw.lookup(&PacketFields::from_frame(1, &syn)?);
//! assert_eq!(trace.ports(), vec![3]);
//! ```

mod fake_network;
mod fake_table;
/// The bodies of the controller and config fuzz targets.
pub mod fuzzing;
/// The controller wired to a fake network: the harness of the core's own tests.
pub mod sim;
#[cfg(test)]
mod tests;

pub use fake_network::{Delivery, FakeNetwork, Hop, NetworkApplyError, NetworkError, PortRef};
pub use fake_table::{
    FakeTable, FakeTableError, FlowEntry, GroupEntry, Hit, PacketFields, RemovalReason, Removed,
    SelectPolicy, Trace,
};
