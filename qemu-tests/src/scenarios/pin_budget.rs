//! A hostile user past its pin budget through the guest agent in VM mode: it opens one
//! connection after another, each registering memory of its own, until the agent refuses
//! (`NO_MEMORY`, `ENOMEM` for `ibv_reg_mr`). Checked: exactly as many registrations as the
//! budget holds succeed; the agent made their pages resident to pin them (the guest's shared
//! memory grew by them: the hostile process never touches its buffers) and nothing past them
//! (the guest's available memory fell by at most the budget and a stated slack); and the
//! memory is given back once the hostile connections close. (The agent's `VmPin` is printed,
//! not checked: Linux 6.18 counts io_uring's pins of a root process there, the guest's 7.3
//! does not.)

use std::path::Path;
use std::thread;
use std::time::{Duration, Instant};

use vrdma::dma::DmaBuffer;
use vrdma::transport::agent::AgentTransport;
use vrdma::transport::Transport;
use vrdma_spec::control::{ControlRequest, RegMr, ResponseBody};
use vrdma_spec::Status;

use super::isolation::{alloc_pd, command, reg_mr_request};
use crate::error::{Error, IoContext, Result};

/// Bytes each hostile connection registers (its own memory: its guest RAM must hold it).
pub const CHUNK: u64 = 2 << 20;
/// What the guest's shared memory may change by meanwhile besides the hostile registrations
/// (the other processes' buffers are a few pages, already resident).
const SHMEM_SLACK_KIB: u64 = 4 << 10;
/// The bound on what the guest's available memory may fall by beyond the budget.
pub const AVAILABLE_SLACK_KIB: u64 = 32 << 10;

/// The hostile connections, holding their registrations until dropped.
pub struct Hog {
    _held: Vec<(AgentTransport, DmaBuffer)>,
    /// Registrations that succeeded.
    pub registered: u64,
    /// What the guest's `Shmem` grew by, in KiB.
    pub resident_kib: u64,
    /// What the guest's `MemAvailable` fell by, in KiB (negative: it rose).
    pub available_drop_kib: i64,
    /// What the agent's `VmPin` grew by, in KiB (see the module documentation).
    pub vm_pin_kib: i64,
    /// The guest's `Shmem` before, in KiB.
    shmem_before_kib: u64,
}

impl Hog {
    pub fn summary(&self, budget_mib: u64) -> String {
        format!(
            "{} registrations of {} MiB over {} connections within the budget of {budget_mib} MiB, the next refused NO_MEMORY; the agent made {} KiB resident for them (VmPin {:+} KiB), the guest's available memory fell by {} KiB",
            self.registered,
            CHUNK >> 20,
            self.registered + 1,
            self.resident_kib,
            self.vm_pin_kib,
            self.available_drop_kib
        )
    }
}

/// Registers [`CHUNK`] per connection of this process's user through the agent at `socket`
/// (process `agent_pid`) until refused; fails unless exactly `budget_mib / CHUNK` succeed
/// and the resident and available memory say the same.
pub fn pin_past_budget(socket: &Path, agent_pid: u32, budget_mib: u64) -> Result<Hog> {
    let allowed = (budget_mib << 20) / CHUNK;
    let pinned_before = vm_pin_kib(agent_pid)?;
    let shmem_before = meminfo_kib("Shmem:")?;
    let available_before = meminfo_kib("MemAvailable:")?;
    let mut held = Vec::new();
    for i in 0..=allowed {
        let what = format!("hostile connection {i}");
        let transport = AgentTransport::connect(socket)
            .map_err(|e| Error::Scenario(format!("{what}: connecting: {e}")))?;
        let pd = alloc_pd(&format!("{what}: ALLOC_PD"), &transport)?;
        let buffer = transport
            .dma()
            .alloc(CHUNK as usize, 4096)
            .map_err(|e| Error::Scenario(format!("{what}: {CHUNK} bytes of its memory: {e}")))?;
        let pages = transport
            .dma()
            .translate(buffer.as_ptr(), CHUNK as usize)
            .map_err(|e| Error::Scenario(format!("{what}: translate: {e}")))?;
        let (req, list) = reg_mr_request(pd, buffer.as_ptr() as u64, &pages);
        match command(&transport, ControlRequest::RegMr(RegMr::new(req, &list)))? {
            Ok(ResponseBody::RegMr(_)) if i < allowed => {}
            Ok(other) => {
                return Err(Error::Scenario(format!(
                    "{what}: REG_MR of {CHUNK} bytes past the budget of {budget_mib} MiB answered {other:?}"
                )))
            }
            Err(e) if e.status() == Status::NoMemory && i == allowed => {}
            Err(e) => {
                return Err(Error::Scenario(format!(
                    "{what}: REG_MR of {CHUNK} bytes ({i} of {allowed} within the budget): {e}"
                )))
            }
        }
        held.push((transport, buffer));
    }
    let resident_kib = meminfo_kib("Shmem:")?.saturating_sub(shmem_before);
    let expected_kib = (allowed * CHUNK) >> 10;
    if resident_kib.abs_diff(expected_kib) > SHMEM_SLACK_KIB {
        return Err(Error::Scenario(format!(
            "the guest's shared memory grew by {resident_kib} KiB for {allowed} registrations of {CHUNK} bytes ({expected_kib} KiB)"
        )));
    }
    let vm_pin_kib = vm_pin_kib(agent_pid)? as i64 - pinned_before as i64;
    let available_drop_kib = available_before as i64 - meminfo_kib("MemAvailable:")? as i64;
    let bound = (budget_mib << 10) + AVAILABLE_SLACK_KIB;
    if available_drop_kib > bound as i64 {
        return Err(Error::Scenario(format!(
            "the guest's available memory fell by {available_drop_kib} KiB, past the budget and slack ({bound} KiB)"
        )));
    }
    Ok(Hog {
        _held: held,
        registered: allowed,
        resident_kib,
        available_drop_kib,
        vm_pin_kib,
        shmem_before_kib: shmem_before,
    })
}

/// Closes the hostile connections and waits (up to `timeout`) until the guest's shared memory
/// is back where it was before them: the agent unpinned and freed their memory. Returns it.
pub fn release(hog: Hog, timeout: Duration) -> Result<u64> {
    let before = hog.shmem_before_kib;
    drop(hog);
    let deadline = Instant::now() + timeout;
    loop {
        // The agent frees a process's memory once it saw the connection close, and io_uring
        // releases a cleared table entry's pages from a work item, soon after.
        let now = meminfo_kib("Shmem:")?;
        if now <= before + SHMEM_SLACK_KIB {
            return Ok(now);
        }
        if Instant::now() >= deadline {
            return Err(Error::Scenario(format!(
                "the guest still holds {now} KiB of shared memory {timeout:?} after the hostile connections closed ({before} KiB before)"
            )));
        }
        thread::sleep(Duration::from_millis(200));
    }
}

/// The `VmPin` of process `pid` (pages pinned for it, io_uring's included), in KiB.
fn vm_pin_kib(pid: u32) -> Result<u64> {
    let path = format!("/proc/{pid}/status");
    let status = std::fs::read_to_string(&path).context(|| path.clone())?;
    kib_field(&status, "VmPin:").ok_or_else(|| Error::Scenario(format!("{path} has no VmPin")))
}

/// A field of `/proc/meminfo`, in KiB.
fn meminfo_kib(name: &str) -> Result<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").context(|| "/proc/meminfo".into())?;
    kib_field(&meminfo, name).ok_or_else(|| Error::Scenario(format!("/proc/meminfo has no {name}")))
}

/// The value of a `Name:   123 kB` line.
fn kib_field(text: &str, name: &str) -> Option<u64> {
    text.lines()
        .find_map(|line| line.strip_prefix(name))?
        .trim()
        .strip_suffix("kB")?
        .trim()
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kib_fields_are_read_from_proc_lines() {
        let status = "Name:\tvrdma-guestd\nVmLck:\t       0 kB\nVmPin:\t   16392 kB\n";
        assert_eq!(kib_field(status, "VmPin:"), Some(16392));
        assert_eq!(kib_field(status, "VmHWM:"), None);
        assert_eq!(kib_field("VmPin:\t12 pages\n", "VmPin:"), None);
    }
}
