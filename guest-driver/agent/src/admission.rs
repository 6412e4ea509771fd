//! How many application processes the agent serves at once, in all and per user: one user
//! cannot take every session of the agent from the others.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;

/// Why a process is not served.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// The agent serves its maximum of processes.
    #[error("the agent serves its maximum of {0} processes")]
    Full(usize),
    /// The process's user has its maximum of processes served.
    #[error("user {uid} already has its maximum of {max} processes served")]
    UserFull {
        /// The user.
        uid: u32,
        /// Its limit.
        max: usize,
    },
}

/// The counts of processes being served.
#[derive(Clone)]
pub struct Admission {
    limits: (usize, usize),
    counts: Arc<Mutex<Counts>>,
}

#[derive(Default)]
struct Counts {
    total: usize,
    per_user: HashMap<u32, usize>,
}

/// One process being served; the counts go down when it is dropped.
pub struct Ticket {
    uid: u32,
    counts: Arc<Mutex<Counts>>,
}

impl Admission {
    /// At most `max_total` processes, `max_per_user` of any one user.
    pub fn new(max_total: usize, max_per_user: usize) -> Self {
        Admission {
            limits: (max_total, max_per_user),
            counts: Arc::new(Mutex::new(Counts::default())),
        }
    }

    /// Admits a process of user `uid`, or says why not.
    pub fn admit(&self, uid: u32) -> Result<Ticket, Refusal> {
        let (max_total, max_per_user) = self.limits;
        let mut counts = self.counts.lock();
        if counts.total >= max_total {
            return Err(Refusal::Full(max_total));
        }
        let of_user = counts.per_user.entry(uid).or_default();
        if *of_user >= max_per_user {
            return Err(Refusal::UserFull {
                uid,
                max: max_per_user,
            });
        }
        *of_user += 1;
        counts.total += 1;
        Ok(Ticket {
            uid,
            counts: self.counts.clone(),
        })
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let mut counts = self.counts.lock();
        counts.total -= 1;
        if let Some(of_user) = counts.per_user.get_mut(&self.uid) {
            *of_user -= 1;
            if *of_user == 0 {
                counts.per_user.remove(&self.uid);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_hold_per_user_and_in_all_and_free_up_on_drop() {
        let admission = Admission::new(3, 2);
        let a1 = admission.admit(1000).unwrap();
        let _a2 = admission.admit(1000).unwrap();
        assert_eq!(
            admission.admit(1000).err(),
            Some(Refusal::UserFull { uid: 1000, max: 2 })
        );
        let _b1 = admission.admit(1001).unwrap();
        assert_eq!(admission.admit(1002).err(), Some(Refusal::Full(3)));
        drop(a1);
        let _a3 = admission.admit(1000).unwrap();
        assert_eq!(admission.admit(1001).err(), Some(Refusal::Full(3)));
    }
}
