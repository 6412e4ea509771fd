//! How much memory the agent pins for its processes' registrations, per user and in all.
//!
//! In VM mode the agent itself pins the pages of every registration (see `pinned.rs`). It runs
//! as root, and io_uring charges a process with `CAP_IPC_LOCK` no locked memory, so without a
//! bound of its own any member of the socket's group could make it pin the guest's RAM away.
//! Each registration is charged the bytes it pins before anything is pinned, against a budget
//! of its user (summed over all its processes) and one of the agent; past either, the
//! registration is refused (`ibv_reg_mr` fails with `ENOMEM`) and nothing else changes.
//!
//! A registration is charged every page it pins, also pages another registration pins too,
//! as the kernel charges `ib_umem_get` to `RLIMIT_MEMLOCK`: a process can replace the pages of
//! its memfd under a pinned registration (`fallocate` punching a hole), so the page a second
//! registration of the same range pins need not be the first one's, and counting a range once
//! would let it pin without bound.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;

/// The bounds, in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PinLimits {
    /// What all processes of one user may have pinned at once.
    pub per_user: u64,
    /// What the agent pins at once for all processes.
    pub total: u64,
}

impl PinLimits {
    /// The defaults for a guest of `ram` bytes: half of it in all, a quarter per user.
    pub fn for_guest_ram(ram: u64) -> Self {
        PinLimits {
            per_user: ram / 4,
            total: ram / 2,
        }
    }
}

/// Why a registration may not pin.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum OverBudget {
    #[error("user {uid} would have {would} bytes pinned, past its budget of {limit}")]
    User { uid: u32, would: u64, limit: u64 },
    #[error("the agent would have {would} bytes pinned, past its budget of {limit}")]
    Total { would: u64, limit: u64 },
}

/// The budgets and what is charged against them.
#[derive(Debug)]
pub struct PinBudget {
    limits: PinLimits,
    charged: Mutex<Charged>,
}

#[derive(Debug, Default)]
struct Charged {
    total: u64,
    by_user: HashMap<u32, u64>,
}

/// Bytes charged to a user; given back when dropped. Forgotten (`std::mem::forget`), it stays
/// charged for the agent's life, as memory that stays pinned must.
#[derive(Debug)]
#[must_use = "dropping a charge gives the bytes back at once"]
pub struct PinCharge {
    budget: Arc<PinBudget>,
    uid: u32,
    bytes: u64,
}

impl PinBudget {
    pub fn new(limits: PinLimits) -> Arc<Self> {
        Arc::new(PinBudget {
            limits,
            charged: Mutex::new(Charged::default()),
        })
    }

    pub fn limits(&self) -> PinLimits {
        self.limits
    }

    /// Charges `bytes` to `uid` if both its budget and the agent's hold them.
    pub fn charge(self: &Arc<Self>, uid: u32, bytes: u64) -> Result<PinCharge, OverBudget> {
        let mut charged = self.charged.lock();
        let user = charged.by_user.get(&uid).copied().unwrap_or(0);
        let would = user.saturating_add(bytes);
        if would > self.limits.per_user {
            return Err(OverBudget::User {
                uid,
                would,
                limit: self.limits.per_user,
            });
        }
        let total = charged.total.saturating_add(bytes);
        if total > self.limits.total {
            return Err(OverBudget::Total {
                would: total,
                limit: self.limits.total,
            });
        }
        charged.total = total;
        charged.by_user.insert(uid, would);
        Ok(PinCharge {
            budget: self.clone(),
            uid,
            bytes,
        })
    }

    /// What `uid` and everyone have charged now.
    pub fn charged(&self, uid: u32) -> (u64, u64) {
        let charged = self.charged.lock();
        (
            charged.by_user.get(&uid).copied().unwrap_or(0),
            charged.total,
        )
    }
}

impl PinCharge {
    pub fn bytes(&self) -> u64 {
        self.bytes
    }
}

impl Drop for PinCharge {
    fn drop(&mut self) {
        let mut charged = self.budget.charged.lock();
        charged.total -= self.bytes;
        let user = charged
            .by_user
            .get_mut(&self.uid)
            .expect("a charged user is in the table");
        *user -= self.bytes;
        if *user == 0 {
            charged.by_user.remove(&self.uid);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn budget() -> Arc<PinBudget> {
        PinBudget::new(PinLimits {
            per_user: 64 * MIB,
            total: 96 * MIB,
        })
    }

    #[test]
    fn a_user_is_refused_past_its_budget_and_nothing_is_charged_for_the_refusal() {
        let budget = budget();
        let first = budget.charge(1000, 40 * MIB).unwrap();
        assert_eq!(
            budget.charge(1000, 25 * MIB).unwrap_err(),
            OverBudget::User {
                uid: 1000,
                would: 65 * MIB,
                limit: 64 * MIB
            }
        );
        assert_eq!(budget.charged(1000), (40 * MIB, 40 * MIB));
        // Exactly up to the budget is fine.
        let second = budget.charge(1000, 24 * MIB).unwrap();
        assert_eq!(budget.charged(1000), (64 * MIB, 64 * MIB));
        drop(first);
        assert_eq!(budget.charged(1000), (24 * MIB, 24 * MIB));
        drop(second);
        assert_eq!(budget.charged(1000), (0, 0));
    }

    #[test]
    fn users_share_the_total() {
        let budget = budget();
        let _a = budget.charge(1, 64 * MIB).unwrap();
        let b = budget.charge(2, 32 * MIB).unwrap();
        assert_eq!(
            budget.charge(3, MIB).unwrap_err(),
            OverBudget::Total {
                would: 97 * MIB,
                limit: 96 * MIB
            }
        );
        drop(b);
        let _c = budget.charge(3, MIB).unwrap();
        assert_eq!(budget.charged(3), (MIB, 65 * MIB));
    }

    #[test]
    fn the_same_bytes_charged_twice_count_twice() {
        let budget = budget();
        let _once = budget.charge(7, 48 * MIB).unwrap();
        assert!(budget.charge(7, 48 * MIB).is_err());
    }

    #[test]
    fn a_forgotten_charge_stays_charged() {
        let budget = budget();
        std::mem::forget(budget.charge(7, 10 * MIB).unwrap());
        assert_eq!(budget.charged(7), (10 * MIB, 10 * MIB));
    }

    #[test]
    fn defaults_follow_the_guest_ram() {
        assert_eq!(
            PinLimits::for_guest_ram(8 << 30),
            PinLimits {
                per_user: 2 << 30,
                total: 4 << 30
            }
        );
    }
}
