//! The steps both hosts run in the same order: each a verified ping-pong between a server on
//! one host and a client on the other, some with a fault on the link.

use crate::scenarios::pingpong_peer::Impl;
use crate::vm_link::Host;

/// Every RC operation the ping-pong verifies.
pub const VERIFY_OPS: &str = "send,send_imm,write,write_imm,read";

/// One step: who serves, who connects, what they exchange, and what the link does meanwhile.
#[derive(Debug, Clone, Copy)]
pub struct Step {
    pub label: &'static str,
    pub server: (Host, Impl),
    pub client: (Host, Impl),
    pub ops: &'static str,
    pub sizes: &'static str,
    pub iters: u32,
    /// A stream (the tools' `--bw`: a window of messages in flight, goodput measured) instead
    /// of a ping-pong.
    pub bw: bool,
    /// `tc netem` parameters applied to both NICs' egress for the step (`None`: a clean link).
    pub netem: Option<&'static str>,
    /// RC path options of both peers (e.g. `--mtu 4096`); none: the tools' defaults (path MTU
    /// 1024).
    pub tool_args: &'static [&'static str],
}

impl Step {
    /// What `host` does in this step: serve, connect, or nothing.
    pub fn role_of(&self, host: Host) -> Option<(&'static str, Impl)> {
        role_of(host, self.server, self.client)
    }
}

/// What `host` is in an exchange between `server` and `client` (each a host and what runs
/// there): "server" or "client", and what it runs; `None` if it takes no part.
pub fn role_of(
    host: Host,
    server: (Host, Impl),
    client: (Host, Impl),
) -> Option<(&'static str, Impl)> {
    if server.0 == host {
        Some(("server", server.1))
    } else if client.0 == host {
        Some(("client", client.1))
    } else {
        None
    }
}

const SIZES: &str = "1,4096,65536";

const fn clean(
    label: &'static str,
    server: (Host, Impl),
    client: (Host, Impl),
    iters: u32,
) -> Step {
    Step {
        label,
        server,
        client,
        ops: VERIFY_OPS,
        sizes: SIZES,
        iters,
        bw: false,
        netem: None,
        tool_args: &[],
    }
}

const fn faulty(label: &'static str, client: Impl, netem: &'static str, iters: u32) -> Step {
    Step {
        label,
        server: (Host::B, Impl::Native),
        client: (Host::A, client),
        ops: VERIFY_OPS,
        sizes: SIZES,
        iters,
        bw: false,
        netem: Some(netem),
        tool_args: &[],
    }
}

/// The steps of a run. Always the cross-host matrix on a clean link and vrdma under packet
/// duplication; with `faults`, loss and reordering too, each with a native baseline beside
/// it (the `two-hosts-faults` suite: the VM's rxe itself can crash under loss, see the
/// README). `only` keeps the steps whose label contains it (`VRDMA_TWO_HOSTS_ONLY`).
pub fn plan(faults: bool, only: Option<&str>) -> Vec<Step> {
    let iters = 20;
    let mut steps = vec![
        clean(
            "native-a-over-native-b",
            (Host::B, Impl::Native),
            (Host::A, Impl::Native),
            iters,
        ),
        clean(
            "vrdma-a-over-native-b",
            (Host::B, Impl::Native),
            (Host::A, Impl::Vrdma),
            iters,
        ),
        clean(
            "native-b-over-vrdma-a",
            (Host::A, Impl::Vrdma),
            (Host::B, Impl::Native),
            iters,
        ),
        clean(
            "vrdma-a-over-vrdma-b",
            (Host::B, Impl::Vrdma),
            (Host::A, Impl::Vrdma),
            iters,
        ),
        Step {
            tool_args: MTU_4096,
            ..clean(
                "vrdma-a-over-native-b, path MTU 4096",
                (Host::B, Impl::Native),
                (Host::A, Impl::Vrdma),
                iters,
            )
        },
        Step {
            tool_args: MTU_4096,
            ..clean(
                "vrdma-a-over-vrdma-b, path MTU 4096",
                (Host::B, Impl::Vrdma),
                (Host::A, Impl::Vrdma),
                iters,
            )
        },
        ud(
            "vrdma-a-over-native-b, UD",
            (Host::B, Impl::Native),
            (Host::A, Impl::Vrdma),
        ),
        ud(
            "native-b-over-vrdma-a, UD",
            (Host::A, Impl::Vrdma),
            (Host::B, Impl::Native),
        ),
        ud(
            "vrdma-a-over-vrdma-b, UD",
            (Host::B, Impl::Vrdma),
            (Host::A, Impl::Vrdma),
        ),
        faulty(
            "vrdma-a-over-native-b, 5 % duplication",
            Impl::Vrdma,
            DUPLICATION,
            iters,
        ),
    ];
    if faults {
        steps.extend([
            faulty(
                "native-a-over-native-b, 1 % loss",
                Impl::Native,
                LOSS_1,
                iters,
            ),
            faulty(
                "vrdma-a-over-native-b, 1 % loss",
                Impl::Vrdma,
                LOSS_1,
                iters,
            ),
            faulty(
                "native-a-over-native-b, 5 % loss",
                Impl::Native,
                LOSS_5,
                iters,
            ),
            faulty(
                "vrdma-a-over-native-b, 5 % loss",
                Impl::Vrdma,
                LOSS_5,
                iters,
            ),
            faulty(
                "native-a-over-native-b, reordering",
                Impl::Native,
                REORDERING,
                iters,
            ),
            faulty(
                "vrdma-a-over-native-b, reordering",
                Impl::Vrdma,
                REORDERING,
                iters,
            ),
        ]);
    }
    steps
        .into_iter()
        .filter(|step| only.is_none_or(|only| step.label.contains(only)))
        .collect()
}

/// A UD exchange: sends up to what one packet of the path MTU carries, through address
/// handles whose destination MAC the host resolved for the link.
fn ud(label: &'static str, server: (Host, Impl), client: (Host, Impl)) -> Step {
    Step {
        ops: "ud_send",
        sizes: "1,64,512",
        ..clean(label, server, client, 20)
    }
}

/// The path options of the path-MTU-4096 steps (the NICs' MTU allows it: see
/// [`crate::vm_link::LINK_MTU`]).
pub const MTU_4096: &[&str] = &["--mtu", "4096"];

/// The goodput steps of `vrdma-vm bench`: a stream of 4 KiB RDMA WRITEs from host A to a
/// native peer on host B (16 in flight), native and over vrdma, on a clean link and under
/// 1 % loss on both NICs' egress.
pub fn goodput() -> Vec<Step> {
    let stream = |label, client, netem| Step {
        label,
        server: (Host::B, Impl::Native),
        client: (Host::A, client),
        ops: "write",
        sizes: "4096",
        iters: 4000,
        bw: true,
        netem,
        tool_args: &[],
    };
    vec![
        stream("native-a-over-native-b, stream", Impl::Native, None),
        stream("vrdma-a-over-native-b, stream", Impl::Vrdma, None),
        stream(
            "native-a-over-native-b, stream, 1 % loss",
            Impl::Native,
            Some(LOSS_1),
        ),
        stream(
            "vrdma-a-over-native-b, stream, 1 % loss",
            Impl::Vrdma,
            Some(LOSS_1),
        ),
    ]
}

/// `tc netem` parameters of the faults.
pub const DUPLICATION: &str = "duplicate 5%";
pub const LOSS_1: &str = "loss 1%";
pub const LOSS_5: &str = "loss 5%";
/// netem reorders by sending some packets at once and delaying the rest.
pub const REORDERING: &str = "delay 1ms reorder 25% 50%";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_step_crosses_the_link_and_labels_are_unique() {
        let steps = plan(true, None);
        for step in &steps {
            assert_ne!(step.server.0, step.client.0, "{step:?}");
            for host in Host::BOTH {
                assert!(step.role_of(host).is_some(), "{step:?}");
            }
        }
        let mut labels: Vec<_> = steps.iter().map(|s| s.label).collect();
        labels.sort();
        labels.dedup();
        assert_eq!(labels.len(), steps.len());
    }
}
