//! Tenants with their own addresses on one vrdma-backend, one of them hostile, in the rxe VM
//! (issue 13's malicious-guest suite).

mod common;

use vrdma_qemu_tests::scenarios::tenants::{Results, ATTACKER, PEER, VICTIM};
use vrdma_tools::hostile::Attack;

#[test]
fn tenants_keep_their_addresses_and_a_hostile_one_hurts_nobody() {
    let Some(r) = common::vrdma_vm_json::<Results>(&["test", "tenants"]) else {
        return;
    };

    // The daemon put every tenant's address on rxe0's netdev, and took them away again.
    for tenant in [ATTACKER, VICTIM, PEER] {
        assert!(
            r.netdev_addresses.iter().any(|a| a == tenant.address),
            "{r:?}"
        );
        assert!(
            !r.addresses_after_stop.iter().any(|a| a == tenant.address),
            "{r:?}"
        );
    }
    // Unmodified examples between two tenants (RC and UD) and with a native peer on the host's
    // own address (RC and UD): each tenant announced its own address as its GID 0, and the RC
    // runs passed (rxe drops RC packets whose source is not the address the peer connected
    // to). The victim rounds below check the GRH source of every UD message.
    assert_eq!(r.identity_runs.len(), 4, "{r:?}");
    for (side, gid) in &r.announced_gids {
        match side.as_str() {
            "victim" => assert_eq!(gid, VICTIM.address, "{r:?}"),
            "peer" => assert_eq!(gid, PEER.address, "{r:?}"),
            "native" => assert!(gid.starts_with("fe80::") && gid != VICTIM.address, "{r:?}"),
            other => panic!("unexpected side {other}: {r:?}"),
        }
    }
    // The connection manager between tenants: rping -V from the peer to the victim's address
    // (the device bound the victim's listener there); the attacker's bind of it refused.
    assert_eq!(r.cm_runs.len(), 1, "{r:?}");
    assert!(!r.cm_runs[0].client_report.is_empty(), "{r:?}");
    assert!(r.cm_foreign_bind.contains("rdma_bind_addr"), "{r:?}");
    // Every attack was tried, every attempt refused, and every legitimate control passed.
    let tried: Vec<Attack> = r.attacks.iter().filter_map(|a| a.attack).collect();
    assert_eq!(tried.len(), 14, "{r:?}");
    for outcome in &r.attacks {
        assert!(outcome.held(), "{outcome:?}");
    }
    let by = |attack: Attack| r.attacks.iter().find(|a| a.attack == Some(attack)).unwrap();
    assert_eq!(
        by(Attack::PinBudget).refusals.keys().collect::<Vec<_>>(),
        ["Quota"]
    );
    // The daemon's mappings of the attacker's staged send queues hit its mapping quota, not its
    // QP quota (the attack stops at four times the mapping quota: reaching it fails `held`).
    let staged = by(Attack::StagedQueues);
    assert_eq!(
        staged.refusals.keys().collect::<Vec<_>>(),
        ["Quota"],
        "{staged:?}"
    );
    assert_eq!(
        by(Attack::LogFlood).attempts,
        vrdma_qemu_tests::scenarios::tenants::FLOOD
    );
    // The flood of malformed commands left a bounded trace in the daemon's log.
    assert!(
        r.attacker_log_lines < 400,
        "{} log lines",
        r.attacker_log_lines
    );
    // The well-behaved tenants kept passing verified ping-pongs (each round checks every
    // byte; one failure fails the suite), before, during and after the attacks.
    assert!(r.victim_rounds >= 2, "{r:?}");
    println!(
        "{} victim ping-pongs, {} started during the attacks",
        r.victim_rounds, r.victim_rounds_during_attacks
    );
    // The attacker that exited in the middle of its registrations was discarded, and once the
    // daemon stopped, rxe held nothing of anyone.
    assert!(r.abrupt_exit_discarded, "{r:?}");
    assert!(r.rxe_idle_after_stop, "{r:?}");
}
