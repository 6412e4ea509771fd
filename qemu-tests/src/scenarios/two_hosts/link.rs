//! What a host sees of its link during a step: the fault on its NIC's egress (`tc netem`), what
//! the qdisc did, and rxe's own counters of retransmissions and out-of-order packets.

use std::collections::BTreeMap;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::inside::DEVICE;
use crate::vm_link::{Host, LINK_NETDEV};

/// Puts `netem` (parameters of `tc qdisc … netem`) on the NIC's egress, or removes any fault.
pub fn set_fault(netem: Option<&str>) -> Result<()> {
    match netem {
        Some(params) => {
            // A fresh qdisc, so that its statistics are this step's.
            let _ = tc(&["qdisc", "del", "dev", LINK_NETDEV, "root"]);
            let mut args = vec!["qdisc", "add", "dev", LINK_NETDEV, "root", "netem"];
            args.extend(params.split_whitespace());
            tc(&args)
        }
        // The NIC's default qdisc is restored by deleting the root; deleting when there is
        // none fails harmlessly.
        None => {
            let _ = tc(&["qdisc", "del", "dev", LINK_NETDEV, "root"]);
            Ok(())
        }
    }
}

/// Changes the parameters of the netem qdisc [`set_fault`] put on the NIC, in place: unlike
/// replacing a qdisc, this never stops the NIC's queue, so traffic that runs meanwhile sees
/// only the new fault (a qdisc swap under traffic made rxe fail a send locally).
pub fn change_fault(netem: &str) -> Result<()> {
    let mut args = vec!["qdisc", "change", "dev", LINK_NETDEV, "root", "netem"];
    args.extend(netem.split_whitespace());
    tc(&args)
}

/// Takes the NIC down or brings it back up. Taking it down flushes its neighbour entries (the
/// addresses stay: the VM's init sets `keep_addr_on_down`), so bringing it up puts the
/// peer's permanent entries back as the init did.
pub fn set_link(up: bool, host: Host) -> Result<()> {
    run(
        "ip",
        &["link", "set", LINK_NETDEV, if up { "up" } else { "down" }],
    )?;
    if up {
        let peer = host.peer();
        for address in [peer.address().to_string(), peer.mac_address()] {
            run(
                "ip",
                &[
                    "-6",
                    "neigh",
                    "replace",
                    &address,
                    "lladdr",
                    peer.mac(),
                    "dev",
                    LINK_NETDEV,
                    "nud",
                    "permanent",
                ],
            )?;
        }
    }
    Ok(())
}

/// Waits until rxe's port is ACTIVE (again).
pub fn wait_port_active(timeout: Duration) -> Result<()> {
    let path = format!("/sys/class/infiniband/{DEVICE}/ports/1/state");
    let deadline = Instant::now() + timeout;
    loop {
        if std::fs::read_to_string(&path).is_ok_and(|state| state.contains("ACTIVE")) {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(Error::Scenario(format!(
                "{path} not ACTIVE after {timeout:?}"
            )));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn tc(args: &[&str]) -> Result<()> {
    run("tc", args)
}

fn run(program: &str, args: &[&str]) -> Result<()> {
    let out = Command::new(program)
        .args(args)
        .output()
        .map_err(|e| Error::Scenario(format!("running {program}: {e}")))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(Error::Scenario(format!(
            "{program} {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        )))
    }
}

/// Packets the root qdisc of the NIC sent and dropped since it was put there.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct QdiscStats {
    pub packets: u64,
    pub drops: u64,
}

/// The root qdisc's statistics (`tc -s -j qdisc show`).
pub fn qdisc_stats() -> Result<QdiscStats> {
    let out = Command::new("tc")
        .args(["-s", "-j", "qdisc", "show", "dev", LINK_NETDEV, "root"])
        .output()
        .map_err(|e| Error::Scenario(format!("running tc: {e}")))?;
    parse_qdisc_stats(&String::from_utf8_lossy(&out.stdout))
}

fn parse_qdisc_stats(json: &str) -> Result<QdiscStats> {
    let value: serde_json::Value = serde_json::from_str(json)
        .map_err(|e| Error::Scenario(format!("tc -j output {json:?}: {e}")))?;
    let root = value
        .as_array()
        .and_then(|qdiscs| qdiscs.first())
        .ok_or_else(|| Error::Scenario(format!("no root qdisc in {json:?}")))?;
    let field = |name: &str| {
        root.get(name)
            .and_then(serde_json::Value::as_u64)
            .unwrap_or(0)
    };
    Ok(QdiscStats {
        packets: field("packets"),
        drops: field("drops"),
    })
}

/// Frames the NIC sent and received (its sysfs statistics): what crossed the link.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct NicFrames {
    pub tx: u64,
    pub rx: u64,
}

impl NicFrames {
    /// The NIC's counts now.
    pub fn read() -> Result<NicFrames> {
        let counter = |name: &str| -> Result<u64> {
            let path = format!("/sys/class/net/{LINK_NETDEV}/statistics/{name}");
            std::fs::read_to_string(&path)
                .ok()
                .and_then(|text| text.trim().parse().ok())
                .ok_or_else(|| Error::Scenario(format!("cannot read {path}")))
        };
        Ok(NicFrames {
            tx: counter("tx_packets")?,
            rx: counter("rx_packets")?,
        })
    }

    /// Frames since `earlier`.
    pub fn since(self, earlier: NicFrames) -> NicFrames {
        NicFrames {
            tx: self.tx.saturating_sub(earlier.tx),
            rx: self.rx.saturating_sub(earlier.rx),
        }
    }
}

pub use crate::inside::rxe_counters;

/// The counters that changed from `before` to `after`, by how much.
pub fn counter_deltas(
    before: &BTreeMap<String, u64>,
    after: &BTreeMap<String, u64>,
) -> BTreeMap<String, u64> {
    after
        .iter()
        .filter_map(|(name, &value)| {
            let delta = value.saturating_sub(before.get(name).copied().unwrap_or(0));
            (delta > 0).then(|| (name.clone(), delta))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn qdisc_statistics_come_from_tc_json() {
        let json = r#"[{"kind":"netem","handle":"8001:","root":true,"refcnt":2,
            "options":{"limit":1000,"loss-random":{"loss":0.05,"correlation":0}},
            "bytes":123456,"packets":700,"drops":33,"overlimits":0,"requeues":0,
            "backlog":0,"qlen":0}]"#;
        assert_eq!(
            parse_qdisc_stats(json).unwrap(),
            QdiscStats {
                packets: 700,
                drops: 33
            }
        );
        assert!(parse_qdisc_stats("[]").is_err());
    }

    #[test]
    fn only_changed_counters_are_kept() {
        let before = BTreeMap::from([("a".to_string(), 5), ("b".to_string(), 1)]);
        let after = BTreeMap::from([
            ("a".to_string(), 9),
            ("b".to_string(), 1),
            ("c".to_string(), 2),
        ]);
        assert_eq!(
            counter_deltas(&before, &after),
            BTreeMap::from([("a".to_string(), 4), ("c".to_string(), 2)])
        );
    }
}
