//! A hostile guest: attacks on the device that must each fail with a clear status (or, on the
//! data path, an error completion) while the daemon keeps serving the guests beside it. The
//! malicious-guest suite of the VM tests runs them against a daemon whose guests have their own
//! addresses, with a well-behaved guest passing a verified ping-pong throughout.
//!
//! Every attack also runs a *control*: the same operation done legitimately, which must succeed.
//! An attack whose control fails proves nothing, so the report counts both.

mod address;
mod resources;
mod setup;

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use vrdma::verbs::{Context, VerbsError};

pub use setup::Kit;

/// The attacks, by name.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, clap::ValueEnum, Serialize, Deserialize,
)]
#[serde(rename_all = "kebab-case")]
pub enum Attack {
    /// MODIFY_QP to RTR with a source GID index that is not one of the guest's.
    SgidAv,
    /// MODIFY_QP (RTS to RTS) with an alternate path from a source GID that is not the guest's.
    SgidAltPath,
    /// CREATE_AH with a source GID index that is not the guest's.
    SgidAh,
    /// A UD send whose WQE names no AH (`ah_num` 0) and carries its own address vector with a
    /// forged source address (rxe's legacy path).
    ForgedUdAv,
    /// UD sends naming AH numbers the guest does not own (guessed host `ah_num`s).
    ForeignAhNum,
    /// An RC QP aimed at another guest's QP number through the attacker's own address.
    ForeignQpnRc,
    /// A UD send to another guest's QP number, and to QP 1 (the host's GSI), through the
    /// attacker's own address.
    ForeignQpnUd,
    /// A QP and an AH aimed at a destination outside the guest's allowed peers.
    ForbiddenPeer,
    /// A traffic class outside the guest's allowed set.
    TrafficClass,
    /// A REG_MR whose page list is every other page of a buffer (one mapping per page).
    ScatteredPages,
    /// A REG_MR whose page list names one page many times.
    RepeatedPages,
    /// REG_MRs until the pinned-memory budget refuses one.
    PinBudget,
    /// UD QPs until one is refused: each staged send queue is a mapping in the daemon, which
    /// the guest's mapping quota must bound (not only its QP quota).
    StagedQueues,
    /// Malformed commands in a tight loop (the daemon's log must stay bounded).
    LogFlood,
}

/// What the attacks need to know beyond the attacker's own device.
#[derive(Clone, Debug, Default)]
pub struct Targets {
    /// The other guest's socket: cross-guest attacks create their victim QPs there.
    pub victim_socket: Option<std::path::PathBuf>,
    /// Pages of the scattered and repeated page lists.
    pub pages: u32,
    /// A traffic class the attacker's policy does not allow.
    pub bad_traffic_class: u8,
    /// Malformed commands sent by [`Attack::LogFlood`].
    pub flood: u32,
    /// Bytes of each MR of [`Attack::PinBudget`].
    pub pin_chunk: usize,
    /// UD QPs [`Attack::StagedQueues`] creates at most: reaching it means nothing bounded
    /// the daemon's mappings below it.
    pub queue_bound: u32,
    /// A destination GID the attacker's policy does not allow.
    pub forbidden_peer: Option<[u8; 16]>,
}

/// What one attack did.
#[derive(Debug, Default, Clone, PartialEq, Serialize, Deserialize)]
pub struct Outcome {
    /// The attack.
    pub attack: Option<Attack>,
    /// Attempts made.
    pub attempts: u32,
    /// Attempts refused (a non-OK status or an error completion).
    pub refused: u32,
    /// How the refusals were reported, by status name.
    pub refusals: BTreeMap<String, u32>,
    /// Attempts the device let through: each one is a hole.
    pub accepted: Vec<String>,
    /// Legitimate operations of the same kind that failed (the attack then proves nothing).
    pub controls_failed: Vec<String>,
    /// Legitimate operations that succeeded.
    pub controls_passed: u32,
    /// Notes: amounts reached, limits observed.
    pub notes: Vec<String>,
}

impl Outcome {
    fn new(attack: Attack) -> Self {
        Outcome {
            attack: Some(attack),
            ..Outcome::default()
        }
    }

    /// Records an attempt that the device answered with `result`.
    fn attempt<T>(&mut self, what: impl Into<String>, result: Result<T, VerbsError>) {
        self.attempts += 1;
        match result {
            Ok(_) => self.accepted.push(what.into()),
            Err(e) => self.refused_as(status_name(&e)),
        }
    }

    /// Records an attempt refused on the data path or in a way named by `how`.
    fn refused_as(&mut self, how: String) {
        self.refused += 1;
        *self.refusals.entry(how).or_default() += 1;
    }

    /// Records a legitimate operation.
    fn control<T>(&mut self, what: impl Into<String>, result: Result<T, VerbsError>) -> Option<T> {
        match result {
            Ok(value) => {
                self.controls_passed += 1;
                Some(value)
            }
            Err(e) => {
                self.controls_failed.push(format!("{}: {e}", what.into()));
                None
            }
        }
    }

    /// True when every attempt was refused and every control passed.
    pub fn held(&self) -> bool {
        self.attempts > 0
            && self.refused == self.attempts
            && self.accepted.is_empty()
            && self.controls_failed.is_empty()
    }
}

/// The status a refused command carried, or what else went wrong.
fn status_name(e: &VerbsError) -> String {
    match e.status() {
        Some(status) => format!("{status:?}"),
        None => format!("error: {e}"),
    }
}

/// Runs `attack` from `ctx`.
pub fn run(ctx: &Context, attack: Attack, targets: &Targets) -> Outcome {
    let mut outcome = Outcome::new(attack);
    let result = match Kit::new(ctx) {
        Ok(kit) => match attack {
            Attack::SgidAv => address::sgid_av(&kit, &mut outcome),
            Attack::SgidAltPath => address::sgid_alt_path(&kit, &mut outcome),
            Attack::SgidAh => address::sgid_ah(&kit, &mut outcome),
            Attack::ForgedUdAv => address::forged_ud_av(&kit, &mut outcome),
            Attack::ForeignAhNum => address::foreign_ah_num(&kit, &mut outcome),
            Attack::ForeignQpnRc => address::foreign_qpn_rc(&kit, targets, &mut outcome),
            Attack::ForeignQpnUd => address::foreign_qpn_ud(&kit, targets, &mut outcome),
            Attack::ForbiddenPeer => address::forbidden_peer(&kit, targets, &mut outcome),
            Attack::TrafficClass => address::traffic_class(&kit, targets, &mut outcome),
            Attack::ScatteredPages => resources::scattered_pages(&kit, targets, &mut outcome),
            Attack::RepeatedPages => resources::repeated_pages(&kit, targets, &mut outcome),
            Attack::PinBudget => resources::pin_budget(&kit, targets, &mut outcome),
            Attack::StagedQueues => resources::staged_queues(&kit, targets, &mut outcome),
            Attack::LogFlood => resources::log_flood(&kit, targets, &mut outcome),
        },
        Err(e) => Err(e),
    };
    if let Err(e) = result {
        outcome
            .controls_failed
            .push(format!("setting the attack up: {e}"));
    }
    outcome
}
