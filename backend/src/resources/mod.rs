//! A guest's objects as it names them: handle tables ([`table`]) of each [`kind`] of object,
//! bounded by the guest's [`quotas`].

pub mod kind;
pub mod quotas;
pub mod table;
